//! Pipelined calls on one connection from one thread, without tokio (Dagger §3.2–3.4):
//! `submit` many, `poll` for whichever replies have come, matched by call id in any order.
//!
//! Requests are batched: consecutive submits are written back to back into one run of the
//! replica's receive buffer and published with one queue entry and one doorbell check (the
//! server answers each separately). How many go in a batch is the replica's soft register
//! (`netless ctl SERVICE set batch=N batch_mode=fixed|adaptive`), read on every submit:
//!
//! - `fixed`: a batch is published when it holds `batch` requests (or on `flush`/`wait`);
//! - `adaptive` (default): a request goes out at once, alone, while the server has fewer
//!   than 8 of ours outstanding, so at low load there is no batching and no added latency
//!   (docs/design.md, "Runs of lone requests", has the figures). Otherwise it joins the
//!   open batch, which goes out when it holds `batch`, or at the caller's next
//!   `poll` once it holds an eighth of the requests the server still has of ours, or at
//!   `wait`/`flush`. A batch thus holds what the caller submitted while the server was busy
//!   (a caller behind its arrivals submits many between polls), and a caller keeping a deep
//!   window sends full batches even when it polls after every submit; a batch left short
//!   goes out as replies bring that eighth down to it. This is Nagle's rule with the
//!   caller's own poll for the acknowledgement: no timer, and no shared-memory read.
//!
//! ```no_run
//! let mut pipe = netless::Pipeline::connect("demo.Echo", netless::ClientConfig::default())?;
//! for i in 0..100u32 {
//!     pipe.submit("Echo", &i.to_le_bytes())?;
//! }
//! let mut replies = 0;
//! while replies < 100 {
//!     pipe.wait(None)?;
//!     replies += pipe.poll(|_id, reply| assert!(reply.is_ok()))?;
//! }
//! # Ok::<(), netless::Status>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use netless_ring::prefetch::prefetch_write_range;
use netless_ring::EnqueueError;

use crate::client::{parse_response, Client, Shared};
use crate::config::ClientConfig;
use crate::layout::{
    align64, align8, batch_mode, compact_flags, kind, wire_flags, CompactHeader, CompactReply,
    ResponseHeader, ShortHeader, WireHeader, COMPACT_HEADER_LEN, COMPACT_REPLY_LEN, HEADER_LEN,
    RESPONSE_HEADER_LEN, SHORT_HEADER_LEN,
};
use crate::metadata::Metadata;
use crate::status::{Code, ReplyCode, Status};
use crate::sync::Ordering;

/// Set in a slot whose call is in flight.
const BUSY: u32 = 1 << 31;

/// A call's id: its slot's generation (16 bits, wrapping) above its slot index (16 bits,
/// `max_in_flight` ≤ 65536), so that every id fits a `CompactHeader`'s 32 bits.
fn call_id(generation: u32, index: u32) -> u64 {
    (u64::from(generation & 0xffff) << 16) | u64::from(index & 0xffff)
}

/// Takes call slot `index` (just popped from the free list) for a new call: its id.
#[inline(always)]
fn claim(slots: &mut [u32], index: u32) -> u64 {
    let generation = (slots[index as usize] & !BUSY).wrapping_add(1) & 0xffff;
    slots[index as usize] = generation | BUSY;
    call_id(generation, index)
}

/// Appends a compact request for `call_id` to the open batch `staged` in its `run`: the
/// header, then the method's name unless `same_method` (it repeats the request before it),
/// then the payload; marks the request before it as followed.
///
/// # Safety
/// `run` is `staged`'s run, ours and unpublished; the batch holds at least one request,
/// `used + align8(COMPACT_HEADER_LEN + name + payload)` bytes fit in the run, and the
/// lengths fit a `CompactHeader`'s fields.
#[inline(always)]
unsafe fn write_compact(
    staged: &mut Staged,
    run: *mut u8,
    call_id: u64,
    method: &str,
    payload: &[u8],
    same_method: bool,
) {
    let name: &[u8] = if same_method { &[] } else { method.as_bytes() };
    let header = CompactHeader {
        call_id: call_id as u32,
        body_len: (name.len() + payload.len()) as u16,
        method_len: name.len() as u8,
        flags: if same_method {
            compact_flags::SAME_METHOD
        } else {
            0
        },
    };
    // The predecessor's header lies at `last` inside the run (the first's is written at
    // publish and flagged in `first`), and the new request fits at `used`.
    // SAFETY: the caller's contract, as just said.
    unsafe {
        if staged.count == 1 {
            staged.first.reserved[0] |= wire_flags::BATCH_MORE;
        } else {
            let prev = run.add(staged.last) as *mut CompactHeader;
            let mut p = CompactHeader::read_from(prev as *const u8);
            p.flags |= compact_flags::MORE;
            std::ptr::write_unaligned(prev, p);
        }
        let dst = run.add(staged.used);
        std::ptr::copy_nonoverlapping(header.as_bytes().as_ptr(), dst, COMPACT_HEADER_LEN);
        let body = dst.add(COMPACT_HEADER_LEN);
        netless_shm::copy::copy_bytes(name.as_ptr(), body, name.len());
        netless_shm::copy::copy_bytes(payload.as_ptr(), body.add(name.len()), payload.len());
    }
    staged.last = staged.used;
    staged.used += align8(COMPACT_HEADER_LEN + name.len() + payload.len());
    staged.count += 1;
}

/// Whether `call_id` names the call in flight in its slot (a reply to anything else is
/// refused: ids come from memory the server writes).
fn is_live(slots: &[u32], call_id: u64) -> bool {
    call_id >> 32 == 0
        && slots.get(Pipeline::slot(call_id)) == Some(&((call_id >> 16) as u32 | BUSY))
}

/// In `slot_run`: the call's request is in no kept run.
const NO_RUN: u32 = u32::MAX;

/// Adaptive batching sends a request at once, alone, while the server has fewer than this
/// many of ours outstanding.
const ADAPTIVE_ALONE: u32 = 8;

/// Whether adaptive batching sends a request alone with `outstanding` of ours at the server.
#[inline(always)]
fn adaptive_alone(outstanding: u32) -> bool {
    outstanding < ADAPTIVE_ALONE
}

/// A run of the buffer this pipeline keeps OWNED between batches (`wire_flags::KEEP_BLOCKS`):
/// the server leaves it claimed after reading it, and the next batch is written there once
/// every request in it is answered. A steady stream of batches thus claims no blocks (no
/// CAS per block) and the block table's lines stay in both caches, unwritten.
#[derive(Clone, Copy)]
struct KeptRun {
    start: u32,
    blocks: u32,
    /// Requests in it not yet answered (it is reused only at 0).
    pending: u32,
}

/// A batch being written: a claimed run, `used` bytes of it filled. The first request has a
/// `WireHeader` or a `ShortHeader` (with `BATCH_COMPACT`), the others a `CompactHeader`.
struct Staged {
    start: u32,
    blocks: u32,
    used: usize,
    count: u32,
    /// The first request's header, written to the run when the batch is published (its
    /// block count, flags and stamp are known only then), and the length of its form there.
    first: WireHeader,
    first_len: usize,
    /// Offset of the last request's header in the run (to set its "more" flag).
    last: usize,
    /// The run's id in `Pipeline::kept`, if it is kept.
    kept: Option<u32>,
}

/// A connection of its own for pipelined calls from one thread: see the module docs.
pub struct Pipeline {
    client: Client,
    /// Per call slot: the generation of its last call, with [`BUSY`] set while it is in
    /// flight (a reply is accepted only for a busy slot of its generation).
    slots: Vec<u32>,
    free: Vec<u32>,
    staged: Option<Staged>,
    /// Requests staged or published and not yet answered.
    in_flight: u32,
    /// Calls that failed after they were accepted (a batch the queue refused), reported at
    /// the next `poll`.
    failed: Vec<(u64, Status)>,
    /// Responses arriving in fragments, by call id.
    partial: HashMap<u64, Vec<u8>>,
    /// Largest request a batch slot takes (one run of the buffer).
    max_run_bytes: usize,
    /// Whether every run fits a `ShortHeader`'s 16-bit block count.
    short_runs: bool,
    /// Batches published, and requests in them.
    batches: u64,
    batched: u64,
    /// Requests in the last batch published (an adaptive batch claims room for twice that).
    last_batch: u32,
    /// The call ids of the open batch, in order (kept here, not read back from the run).
    staged_ids: Vec<u64>,
    /// The method of the last request written: a compact request calling it again carries
    /// `SAME_METHOD` instead of the name.
    last_method: String,
    /// Runs kept between batches.
    kept: KeptRuns,
}

/// The runs a pipeline keeps ([`KeptRun`]) and which call is in which.
struct KeptRuns {
    /// By id (`None`: a vacant id).
    runs: Vec<Option<KeptRun>>,
    /// Ids of kept runs holding no request in flight, oldest first: the next batches go
    /// there, in the order the server read them (it has long let go of their lines).
    idle: VecDeque<u32>,
    /// Per call slot: the kept run its request is in, or [`NO_RUN`].
    slot_run: Vec<u32>,
    /// Blocks held in kept runs.
    blocks: u32,
}

impl KeptRuns {
    fn new(slots: usize) -> KeptRuns {
        KeptRuns {
            runs: Vec::new(),
            idle: VecDeque::new(),
            slot_run: vec![NO_RUN; slots],
            blocks: 0,
        }
    }

    /// Starts keeping `start..start + blocks`; its id.
    fn add(&mut self, start: u32, blocks: u32) -> u32 {
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
    fn forget(&mut self, id: u32) {
        if let Some(run) = self.runs.get_mut(id as usize).and_then(Option::take) {
            self.blocks -= run.blocks;
        }
    }

    /// Run `id` went to the server holding the requests of `call_ids`.
    fn published(&mut self, id: u32, call_ids: &[u64]) {
        if let Some(Some(run)) = self.runs.get_mut(id as usize) {
            run.pending = call_ids.len() as u32;
        }
        for &call_id in call_ids {
            self.slot_run[Pipeline::slot(call_id)] = id;
        }
    }

    /// An idle kept run of at least `need` blocks, still OWNED by us: the whole run if
    /// `WHOLE`, else only its first `need` blocks, for a caller that writes no more (a lone
    /// 64-byte echo reusing a run kept for an adaptive batch of 32 then reads 2 table words,
    /// not 37, which at low load cost every lone request that reused such a run: design.md,
    /// "Runs of lone requests"). Smaller runs met on the way are given back (the batches
    /// have grown past them), and ones no longer ours (the table is memory the server
    /// writes) forgotten.
    fn take_idle<const WHOLE: bool>(
        &mut self,
        shared: &Shared,
        need: u32,
    ) -> Option<(u32, KeptRun)> {
        let table = shared.replica.table();
        while let Some(id) = self.idle.pop_front() {
            let Some(run) = self.runs.get(id as usize).copied().flatten() else {
                continue;
            };
            let checked = if WHOLE {
                run.blocks
            } else {
                need.min(run.blocks)
            };
            if !shared.lease.holds(table, run.start, checked) {
                self.forget(id);
            } else if run.blocks < need {
                self.forget(id);
                shared.lease.unclaim(table, run.start, run.blocks);
            } else {
                return Some((id, run));
            }
        }
        None
    }

    /// The request of call slot `index` was answered: its run may become idle.
    fn answered(&mut self, index: usize) {
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

impl Pipeline {
    /// Opens a dedicated connection to `service` for pipelined calls; `config.max_in_flight`
    /// bounds the calls outstanding at once.
    pub fn connect(service: &str, config: ClientConfig) -> Result<Pipeline, Status> {
        let n = config.max_in_flight;
        let client = Client::connect_with(service, config)?;
        let max_run_bytes = client.shared().fragment_body + HEADER_LEN;
        let block = client.shared().replica.block_size();
        let short_runs = max_run_bytes.div_ceil(block) <= usize::from(u16::MAX);
        Ok(Pipeline {
            client,
            slots: vec![0; n as usize],
            free: (0..n).rev().collect(),
            staged: None,
            in_flight: 0,
            failed: Vec::new(),
            partial: HashMap::new(),
            max_run_bytes,
            short_runs,
            batches: 0,
            batched: 0,
            last_batch: 1,
            staged_ids: Vec::new(),
            last_method: String::new(),
            kept: KeptRuns::new(n as usize),
        })
    }

    /// The doorbell this pipeline's replies ring: a server whose handler forwards calls on
    /// it returns this from [`Handler::wake_sources`](crate::Handler::wake_sources), so its
    /// worker wakes for replies as well as requests.
    pub fn wake_source(&self) -> crate::WakeSource {
        self.client.wake_source()
    }

    /// The slot of a call id a pipeline returned: below `ClientConfig::max_in_flight`, and
    /// no two calls in flight on one pipeline share one, so per-call state can live in a
    /// `Vec` indexed by it (a slot is reused once its call has its reply).
    ///
    /// ```no_run
    /// use netless::{ClientConfig, Pipeline};
    /// let config = ClientConfig::default();
    /// let mut sent_at = vec![None; config.max_in_flight as usize];
    /// let mut pipe = Pipeline::connect("demo.Echo", config)?;
    /// let id = pipe.submit("Echo", b"hi")?;
    /// sent_at[Pipeline::slot(id)] = Some(std::time::Instant::now());
    /// pipe.wait(None)?;
    /// pipe.poll(|id, _reply| {
    ///     let rtt = sent_at[Pipeline::slot(id)].take().map(|t| t.elapsed());
    ///     println!("{id}: {rtt:?}");
    /// })?;
    /// # Ok::<(), netless::Status>(())
    /// ```
    pub fn slot(call_id: u64) -> usize {
        (call_id & 0xffff) as usize
    }

    /// Calls submitted and not yet answered.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Batches published so far, and the requests they held (their ratio is the mean
    /// batch size).
    pub fn batch_counts(&self) -> (u64, u64) {
        (self.batches, self.batched)
    }

    /// Whether the connection has closed (every later operation fails).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Queues a call of `method` with `payload` (no metadata, no deadline) and returns its id;
    /// the reply comes from [`Pipeline::poll`]. Never blocks. `RESOURCE_EXHAUSTED` when
    /// `max_in_flight` calls are outstanding (poll first), or as a NACK from the server (see
    /// [`Status::is_nack`]); `INVALID_ARGUMENT` for a request larger than one run of the
    /// server's buffer (use [`Client::call`], which sends fragments).
    #[inline]
    pub fn submit(&mut self, method: &str, payload: &[u8]) -> Result<u64, Status> {
        match self.submit_same(method, payload) {
            Some(call_id) => Ok(call_id),
            None => self.submit_other(method, payload),
        }
    }

    /// Its connection, for fault injection ([`crate::fault::steal_kept_tail`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The runs this pipeline keeps and holds no request in (fault injection).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn idle_kept_runs(&self) -> Vec<(u32, u32)> {
        self.kept
            .idle
            .iter()
            .filter_map(|&id| self.kept.runs.get(id as usize).copied().flatten())
            .map(|run| (run.start, run.blocks))
            .collect()
    }

    /// `submit` where `submit_same` does not apply: `submit_lone`, else the general path.
    /// Out of line, so that `submit` stays small enough to inline into its callers.
    #[inline(never)]
    fn submit_other(&mut self, method: &str, payload: &[u8]) -> Result<u64, Status> {
        match self.submit_lone(method, payload) {
            Some(call_id) => Ok(call_id),
            None => self.submit_any(method, payload),
        }
    }

    /// `submit` of a request that goes out alone (B = 1, or adaptive batching at low load),
    /// when an idle kept run takes it: the request goes straight into the run behind a
    /// `ShortHeader` and is enqueued, with none of a batch's bookkeeping. `None`, with
    /// nothing done, where that does not hold or where any check `submit` makes could fail
    /// (its general path then decides).
    #[inline(always)]
    fn submit_lone(&mut self, method: &str, payload: &[u8]) -> Option<u64> {
        if self.staged.is_some() || !self.short_runs {
            return None;
        }
        let shared = self.client.shared();
        let ctrl = shared.replica.server_control();
        let body_len = method.len() + payload.len();
        let need = SHORT_HEADER_LEN + body_len;
        // A batch of one: batches of one request (B = 1), or adaptive batching at low load
        // (it publishes this one at once, alone).
        let alone = ctrl.batch_max.load(Ordering::Relaxed) <= 1
            || (adaptive_alone(self.in_flight)
                && ctrl.batch_mode.load(Ordering::Relaxed) == batch_mode::ADAPTIVE);
        if !alone
            || method.len() > usize::from(u16::MAX)
            // `submit`'s limits, for a first request with a short header.
            || align64(align8(need)) > self.max_run_bytes
            || body_len > shared.server_max_message
            || shared.dead.load(Ordering::Acquire)
            // Under an SLO requests carry stamps (full headers) and are admitted by depth.
            || crate::admission::stamps(ctrl)
            || self.free.is_empty()
        {
            return None;
        }
        let block = shared.replica.block_size();
        let used = need.div_ceil(block) as u32;
        let (id, run) = self.kept.take_idle::<false>(shared, used)?;
        let index = self.free.pop().expect("a free slot, checked above");
        let call_id = claim(&mut self.slots, index);
        let shared = self.client.shared();
        let dst = shared
            .replica
            .block_run(run.start, used)
            .expect("a kept run lies inside the buffer");
        let header = ShortHeader {
            token: shared.token,
            call_id,
            body_len: body_len as u32,
            method_len: method.len() as u16,
            flags: (wire_flags::BATCH_COMPACT | wire_flags::KEEP_BLOCKS) as u16,
            conn_index: shared.conn_index,
            kind: kind::REQUEST_SHORT,
            nblocks: used as u16,
        };
        // The run's first `used` blocks (take_idle gave a run of at least that many, and
        // checked those) are ours (OWNED, idle: no request of it in flight) and hold the
        // header and body.
        // SAFETY: so these copies stay inside the run, as just said.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_bytes().as_ptr(), dst, SHORT_HEADER_LEN);
            let body = dst.add(SHORT_HEADER_LEN);
            netless_shm::copy::copy_bytes(method.as_ptr(), body, method.len());
            netless_shm::copy::copy_bytes(payload.as_ptr(), body.add(method.len()), payload.len());
        }
        if !crate::bytes::same_bytes(self.last_method.as_bytes(), method.as_bytes()) {
            self.last_method.clear();
            self.last_method.push_str(method);
        }
        self.staged_ids.push(call_id);
        self.in_flight += 1;
        self.enqueue(run.start, used, 1, Some(id));
        Some(call_id)
    }

    /// `submit` for any request: the first of a batch, one naming its method, one that
    /// does not fit the open batch, or one that fails. Out of line, so that the common
    /// case (`submit_same`) is a small function.
    #[inline(never)]
    fn submit_any(&mut self, method: &str, payload: &[u8]) -> Result<u64, Status> {
        let shared = self.client.shared();
        if shared.dead.load(Ordering::Acquire) {
            return Err(shared.death_status());
        }
        let body_len = method.len() + payload.len();
        let ctrl = shared.replica.server_control();
        // A batch's first request takes a short header, or a full one where it needs a
        // field the short one lacks (an enqueue stamp, under an SLO); the rest take a compact
        // one, without the method's name when it repeats the request before it. A request
        // too large for a compact header's fields takes a batch's first place.
        let first_len = if self.short_runs
            && method.len() <= usize::from(u16::MAX)
            && !crate::admission::stamps(ctrl)
        {
            SHORT_HEADER_LEN
        } else {
            HEADER_LEN
        };
        let first_need = align8(first_len + body_len);
        let repeats = crate::bytes::same_bytes(self.last_method.as_bytes(), method.as_bytes());
        let compact_name = if repeats { 0 } else { method.len() };
        let compact_need = align8(COMPACT_HEADER_LEN + compact_name + payload.len());
        let compactable = compact_name <= usize::from(u8::MAX)
            && compact_name + payload.len() <= usize::from(u16::MAX);
        if align64(first_need) > self.max_run_bytes || body_len > shared.server_max_message {
            return Err(Status::invalid_argument(format!(
                "a pipelined request takes at most {} bytes with its header, this one {first_need}: use Client::call for larger ones",
                self.max_run_bytes
            )));
        }
        let Some(index) = self.free.pop() else {
            return Err(Status::resource_exhausted(format!(
                "{} calls already in flight on this pipeline: poll for replies first, or raise ClientConfig::max_in_flight",
                self.slots.len()
            )));
        };
        let batch_max = ctrl.batch_max.load(Ordering::Relaxed).clamp(1, 256);
        let adaptive = ctrl.batch_mode.load(Ordering::Relaxed) == batch_mode::ADAPTIVE;
        let block = shared.replica.block_size();
        if self.staged.as_ref().is_some_and(|s| {
            s.count > 0 && (!compactable || s.used + compact_need > s.blocks as usize * block)
        }) {
            self.publish();
        }
        if let Some(staged) = self.staged.as_ref().filter(|s| s.count > 0) {
            // Under an SLO every request is admitted on its own: one joining an open batch
            // will queue behind that batch's requests as well as those already queued.
            if let Err(nack) = self.client.shared().check_depth(u64::from(staged.count)) {
                self.free.push(index);
                return Err(nack);
            }
        }
        if self.staged.is_none() {
            // Room for the batch this one will most likely end: the whole batch when fixed;
            // when adaptive, this request alone if it goes out alone (low load),
            // else twice the last batch (each slot claimed costs a CAS, so not `batch`
            // blindly, but a batch that filled its room may grow quickly).
            let room = if adaptive {
                if adaptive_alone(self.in_flight) {
                    1
                } else {
                    self.last_batch.saturating_mul(2).clamp(1, batch_max)
                }
            } else {
                batch_max
            };
            if let Err(e) = self.open_batch(first_need, compact_need, room) {
                self.free.push(index);
                return Err(e);
            }
        }
        let call_id = claim(&mut self.slots, index);
        let shared = self.client.shared();
        let staged = self.staged.as_mut().expect("a batch is open");
        let run = shared
            .replica
            .block_run(staged.start, staged.blocks)
            .expect("a claimed run lies inside the buffer");
        if staged.count == 0 {
            // Written when the batch is published.
            staged.first = WireHeader {
                token: shared.token,
                call_id,
                conn_index: shared.conn_index,
                kind: kind::REQUEST,
                body_len: body_len as u32,
                frag_len: body_len as u32,
                method_len: method.len() as u32,
                reserved: [wire_flags::BATCH_COMPACT, 0],
                ..WireHeader::default()
            };
            staged.first_len = first_len;
            // The run is ours (OWNED, unpublished) and `first_need` bytes fit in it
            // (open_batch): the header's room, then the body.
            // SAFETY: so these copies stay inside the run, as just said.
            unsafe {
                let body = run.add(staged.used + first_len);
                netless_shm::copy::copy_bytes(method.as_ptr(), body, method.len());
                netless_shm::copy::copy_bytes(
                    payload.as_ptr(),
                    body.add(method.len()),
                    payload.len(),
                );
            }
            staged.last = staged.used;
            staged.used += first_need;
            staged.count = 1;
        } else {
            // `compactable` (or the batch would have been published): the fields fit; and
            // `used + compact_need` fits in the run (checked above).
            // SAFETY: as write_compact requires.
            unsafe { write_compact(staged, run, call_id, method, payload, repeats) };
        }
        if !repeats {
            self.last_method.clear();
            self.last_method.push_str(method);
        }
        self.staged_one(call_id, batch_max, adaptive);
        Ok(call_id)
    }

    /// `submit`'s common case, first: a request that joins the open batch and calls the
    /// method of the request before it, so it takes a compact header and no name. `None`,
    /// with nothing done, where that does not hold or where any check `submit` makes could
    /// fail (its general path then decides).
    #[inline(always)]
    fn submit_same(&mut self, method: &str, payload: &[u8]) -> Option<u64> {
        let shared = self.client.shared();
        let staged = self.staged.as_ref()?;
        let need = align8(COMPACT_HEADER_LEN + payload.len());
        let ctrl = shared.replica.server_control();
        if staged.count == 0
            || !crate::bytes::same_bytes(method.as_bytes(), self.last_method.as_bytes())
            || payload.len() > usize::from(u16::MAX)
            || staged.used + need > staged.blocks as usize * shared.replica.block_size()
            // `submit`'s limits, with the longer of a first request's headers.
            || align64(align8(HEADER_LEN + method.len() + payload.len())) > self.max_run_bytes
            || method.len() + payload.len() > shared.server_max_message
            || shared.dead.load(Ordering::Acquire)
            // Under an SLO every request is admitted on its own.
            || ctrl.depth_limit.load(Ordering::Relaxed) != 0
        {
            return None;
        }
        let index = self.free.pop()?;
        let call_id = claim(&mut self.slots, index);
        let staged = self.staged.as_mut().expect("the open batch checked above");
        let run = shared
            .replica
            .block_run(staged.start, staged.blocks)
            .expect("a claimed run lies inside the buffer");
        // The batch holds a request, the fields fit a compact header and `used + need` fits
        // in the run (all checked above).
        // SAFETY: write_compact's contract, as just said.
        unsafe { write_compact(staged, run, call_id, method, payload, true) };
        let batch_max = ctrl.batch_max.load(Ordering::Relaxed).clamp(1, 256);
        let adaptive = ctrl.batch_mode.load(Ordering::Relaxed) == batch_mode::ADAPTIVE;
        self.staged_one(call_id, batch_max, adaptive);
        Some(call_id)
    }

    /// Counts call `call_id`, just written into the open batch, and publishes the batch if
    /// it is full, or (adaptive) if the server has fewer than [`ADAPTIVE_ALONE`] of our
    /// earlier requests.
    #[inline(always)]
    fn staged_one(&mut self, call_id: u64, batch_max: u32, adaptive: bool) {
        self.staged_ids.push(call_id);
        self.in_flight += 1;
        let count = self.staged.as_ref().map_or(0, |s| s.count);
        if count >= batch_max || (adaptive && adaptive_alone(self.in_flight - count)) {
            self.publish();
        }
    }

    /// Publishes the batch being written, if any (fixed batching waits for a full batch
    /// otherwise).
    pub fn flush(&mut self) {
        self.publish();
    }

    /// Delivers every reply that has arrived to `on_reply(call_id, reply)`, without waiting,
    /// and returns how many. With adaptive batching it first publishes the batch waiting. `Err` only when the connection is gone or the server wrote
    /// garbage (the connection is then closed); outstanding calls are lost with it.
    pub fn poll(
        &mut self,
        mut on_reply: impl FnMut(u64, Result<&[u8], Status>),
    ) -> Result<usize, Status> {
        let mut delivered = 0;
        for (id, status) in std::mem::take(&mut self.failed) {
            on_reply(id, Err(status));
            self.complete(id);
            delivered += 1;
        }
        if let Some(staged) = &self.staged {
            let adaptive = self
                .client
                .shared()
                .replica
                .server_control()
                .batch_mode
                .load(Ordering::Relaxed)
                == batch_mode::ADAPTIVE;
            if adaptive && staged.count >= self.adaptive_target() {
                self.publish();
            }
        }
        // Borrowed field by field, so `shared` and the call bookkeeping coexist.
        let Pipeline {
            client,
            slots,
            free,
            in_flight,
            partial,
            kept,
            ..
        } = self;
        let shared = client.shared();
        let corrupt = |what: &str| {
            Status::internal(format!(
                "service `{}` wrote a malformed response ({what}); the connection was closed",
                shared.service
            ))
        };
        let Some(mut consumer) = shared.consumer.try_lock() else {
            return Ok(delivered);
        };
        loop {
            let record = match consumer.peek() {
                Ok(Some(record)) => record,
                Ok(None) => break,
                Err(e) => {
                    let status = corrupt(&e.to_string());
                    shared.fail(status.clone());
                    return Err(status);
                }
            };
            let body = record.body();
            if is_reply_batch(body) {
                let max = shared.config.max_message;
                let done = for_each_compact_reply(body, max, |id, code, bytes| {
                    if !is_live(slots, id) {
                        return Err("a reply to no call in flight");
                    }
                    on_reply(id, outcome(code, bytes.0, bytes.1));
                    complete(slots, free, in_flight, kept, id);
                    Ok(())
                });
                match done {
                    Ok(n) => delivered += n,
                    Err(what) => {
                        let status = corrupt(what);
                        shared.fail(status.clone());
                        return Err(status);
                    }
                }
                record.release();
                continue;
            }
            let parsed = parse_response(body, shared.config.max_message).and_then(|parsed| {
                let live = is_live(slots, parsed.0.call_id);
                live.then_some(parsed).ok_or("a reply to no call in flight")
            });
            let (h, code, fragment) = match parsed {
                Ok(v) => v,
                Err(what) => {
                    let status = corrupt(what);
                    shared.fail(status.clone());
                    return Err(status);
                }
            };
            let whole;
            let bytes: &[u8] = if h.frag_len == h.body_len {
                fragment
            } else {
                let buf = partial.entry(h.call_id).or_default();
                if h.frag_offset as usize != buf.len() {
                    let status = corrupt("response fragments out of order");
                    shared.fail(status.clone());
                    return Err(status);
                }
                netless_shm::copy::extend(buf, fragment);
                if buf.len() < h.body_len as usize {
                    record.release();
                    continue;
                }
                whole = partial.remove(&h.call_id).unwrap_or_default();
                &whole
            };
            let md_end = h.metadata_len as usize;
            on_reply(h.call_id, outcome(code, &bytes[..md_end], &bytes[md_end..]));
            record.release();
            complete(slots, free, in_flight, kept, h.call_id);
            delivered += 1;
        }
        drop(consumer);
        if delivered == 0 && shared.dead.load(Ordering::Acquire) {
            return Err(shared.death_status());
        }
        Ok(delivered)
    }

    /// Publishes any batch being written, then waits (per the client's wait policy) until a
    /// reply has arrived, `timeout` passes (`None`: as long as the server lives) or the
    /// connection dies. Returns at once if nothing is in flight.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<(), Status> {
        self.publish();
        if self.in_flight == 0 || !self.failed.is_empty() {
            return Ok(());
        }
        let shared = self.client.shared();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let ready = netless_ring::wait(
            shared.conn.doorbell(),
            &shared.config.wait,
            deadline,
            Duration::from_millis(100),
            || {
                let has = shared.consumer.try_lock().is_some_and(|c| c.has_next());
                (has || shared.dead.load(Ordering::Acquire)).then_some(())
            },
        );
        if shared.dead.load(Ordering::Acquire) {
            return Err(shared.death_status());
        }
        ready.map_err(|_| Status::deadline_exceeded("no reply arrived within the timeout"))
    }

    /// The adaptive batch a poll publishes at: an eighth of the requests the server has of
    /// ours (published, not answered), at least 1. A caller keeping many calls in flight thus
    /// sends them in batches of up to `batch` even if it polls after every submit, and a
    /// batch left short goes out as replies bring the target down to it.
    fn adaptive_target(&self) -> u32 {
        let staged = self.staged.as_ref().map_or(0, |s| s.count);
        ((self.in_flight - staged) / 8).max(1)
    }

    /// Frees the slot of a call that has its outcome (a duplicate reply then finds it idle).
    fn complete(&mut self, call_id: u64) {
        complete(
            &mut self.slots,
            &mut self.free,
            &mut self.in_flight,
            &mut self.kept,
            call_id,
        );
    }

    /// Claims a run for a new batch: room for `batch_max` requests like this one (the first
    /// taking `first_need` bytes, the rest `compact_need`) if the buffer has it, else for this
    /// one alone; a NACK if not even that. (An adaptive batch that outgrows its run is
    /// published and the next request opens a new one.)
    fn open_batch(
        &mut self,
        first_need: usize,
        compact_need: usize,
        batch_max: u32,
    ) -> Result<(), Status> {
        let shared = self.client.shared();
        shared.check_depth(0)?;
        let block = shared.replica.block_size();
        let one = first_need.div_ceil(block) as u32;
        let want = (first_need + compact_need * (batch_max as usize - 1))
            .min(self.max_run_bytes)
            .div_ceil(block) as u32;
        let table = shared.replica.table();
        let (start, blocks, kept) = match self.kept.take_idle::<true>(shared, want.max(one)) {
            Some((id, run)) => (run.start, run.blocks, Some(id)),
            None => {
                let head = shared.shared_head();
                let claimed = shared
                    .lease
                    .claim_fresh(table, head, want.max(one))
                    .map(|s| (s, want.max(one)))
                    .or_else(|| shared.lease.claim_fresh(table, head, one).map(|s| (s, one)));
                let Some((start, blocks)) = claimed else {
                    return Err(shared.nack(format!(
                        "receive buffer of service `{}` is full: retry after polling, or run more replicas",
                        shared.service
                    )));
                };
                // Kept for the batches after this one, within a share of the partition
                // that leaves most of it to the connections sharing it. None under an SLO:
                // the buffer is then sized for the requests the SLO admits, and a run held
                // idle would take from that.
                let slo = shared
                    .replica
                    .server_control()
                    .slo_ns
                    .load(Ordering::Relaxed);
                let budget = if slo == 0 {
                    shared.lease.partition_len() / (4 * shared.sharers())
                } else {
                    0
                };
                let kept =
                    (self.kept.blocks + blocks <= budget).then(|| self.kept.add(start, blocks));
                (start, blocks, kept)
            }
        };
        // Take the run's lines exclusive now (the server read them last): the requests'
        // stores then find them here instead of each waiting for its own transfer. With
        // nothing of ours at the server (low load), only what this request needs: a kept run
        // may be far larger, and a lone request would pay for all its lines.
        let ahead = if self.in_flight == 0 {
            want.max(one)
        } else {
            blocks
        };
        if let Some(run) = shared.replica.block_run(start, blocks) {
            prefetch_write_range(run, ahead.min(blocks) as usize * block, 64);
        }
        self.staged = Some(Staged {
            start,
            blocks,
            used: 0,
            count: 0,
            first: WireHeader::default(),
            first_len: HEADER_LEN,
            last: 0,
            kept,
        });
        Ok(())
    }

    /// Publishes the open batch: trims its run to what it holds, enqueues it, rings.
    fn publish(&mut self) {
        let Some(staged) = self.staged.take() else {
            return;
        };
        let shared = self.client.shared();
        let table = shared.replica.table();
        if staged.count == 0 {
            match staged.kept {
                Some(id) => self.kept.idle.push_back(id),
                None => shared.lease.unclaim(table, staged.start, staged.blocks),
            }
            return;
        }
        let block = shared.replica.block_size();
        let used = staged.used.div_ceil(block) as u32;
        // A kept run stays whole, for batches as large as the one it was claimed for.
        if used < staged.blocks && staged.kept.is_none() {
            shared
                .lease
                .unclaim(table, staged.start + used, staged.blocks - used);
        }
        let run = shared
            .replica
            .block_run(staged.start, used)
            .expect("a claimed run lies inside the buffer");
        let mut h = staged.first;
        h.nblocks = used;
        if staged.kept.is_some() {
            h.reserved[0] |= wire_flags::KEEP_BLOCKS;
        }
        let short;
        let bytes: &[u8] = if staged.first_len == SHORT_HEADER_LEN {
            // No stamp: an SLO set since the batch opened finds it unstamped (admitted
            // however long it waits) rather than moving its body.
            short = ShortHeader::of(&h).expect("the short form was chosen for fields that fit");
            short.as_bytes()
        } else {
            // Under an SLO the batch carries the time it is enqueued (`crate::admission`).
            h.reserved[1] = crate::admission::stamp_for(shared.replica.server_control());
            h.as_bytes()
        };
        // SAFETY: the run's first `first_len` bytes are the first request's header room, ours
        // and unpublished.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), run, staged.first_len) };
        self.enqueue(staged.start, used, staged.count, staged.kept);
    }

    /// Enqueues the run at `start` (`used` blocks of it written), which holds the `count`
    /// requests of `staged_ids`, and rings; the calls fail as NACKs at the next `poll` if
    /// the queue refuses it.
    #[inline(always)]
    fn enqueue(&mut self, start: u32, used: u32, count: u32, kept: Option<u32>) {
        let shared = self.client.shared();
        let table = shared.replica.table();
        let block = shared.replica.block_size();
        let q = shared.replica.queue_for(shared.conn_index);
        match q.queue.try_enqueue(start) {
            Ok(()) => {
                netless_ring::ring(q.doorbell);
                self.batches += 1;
                self.batched += u64::from(count);
                self.last_batch = count;
                if let Some(id) = kept {
                    self.kept.published(id, &self.staged_ids);
                }
                // Start owning what the next batch will write: the kept run it will most
                // likely take (the server read it a while ago) and the queue's cells a line
                // ahead. Those transfers then overlap this batch's wait, instead of stalling
                // the next enqueue's CAS, which waits for every store before it.
                if let Some(run) = self
                    .kept
                    .idle
                    .front()
                    .and_then(|&id| self.kept.runs[id as usize])
                {
                    // After a lone request (low load), only as much as it filled.
                    let ahead = if count == 1 { used } else { run.blocks };
                    if let Some(dst) = shared.replica.block_run(run.start, run.blocks) {
                        prefetch_write_range(dst, ahead.min(run.blocks) as usize * block, 64);
                    }
                }
                q.queue.prefetch_cell_ahead(8);
            }
            Err(e) => {
                match kept {
                    Some(id) => self.kept.idle.push_back(id),
                    None => shared.lease.unclaim(table, start, used),
                }
                let why = match e {
                    EnqueueError::Full => "receive queue is full",
                    _ => "receive queue is contended or damaged",
                };
                // The batch's calls fail as NACKs, reported at the next poll.
                for &call_id in &self.staged_ids {
                    self.failed.push((
                        call_id,
                        shared.nack(format!(
                            "service `{}`: {why}; retry with backoff",
                            shared.service
                        )),
                    ));
                }
            }
        }
        self.staged_ids.clear();
    }
}

/// A reply's outcome from its status code, metadata encoding and the rest of its body.
#[inline]
fn outcome<'b>(code: ReplyCode, metadata: &[u8], rest: &'b [u8]) -> Result<&'b [u8], Status> {
    // Inline up to here: most replies are OK and carry no metadata.
    if metadata.is_empty() && code.code == Code::Ok {
        return Ok(rest);
    }
    outcome_of_the_rest(code, metadata, rest)
}

/// [`outcome`] of a reply with metadata or an error status (out of line).
#[inline(never)]
fn outcome_of_the_rest<'b>(
    code: ReplyCode,
    metadata: &[u8],
    rest: &'b [u8],
) -> Result<&'b [u8], Status> {
    if !metadata.is_empty() {
        Metadata::decode(metadata)?;
    }
    if code.code == Code::Ok {
        Ok(rest)
    } else {
        Err(code.status(rest))
    }
}

/// Whether a ring record holds a batch of compact replies (`kind::RESPONSE_BATCH`).
fn is_reply_batch(record: &[u8]) -> bool {
    // SAFETY: at least RESPONSE_HEADER_LEN bytes (checked first).
    record.len() >= RESPONSE_HEADER_LEN
        && unsafe { ResponseHeader::read_from(record.as_ptr()) }.kind == kind::RESPONSE_BATCH
}

/// Validates a `RESPONSE_BATCH` record (memory the server writes) and calls `each(call id,
/// code, (metadata, rest of body))` for every reply in it, in order; returns how many. Stops
/// at the first thing wrong (or `each`'s error): the connection is then closed.
fn for_each_compact_reply(
    record: &[u8],
    max_message: usize,
    mut each: impl FnMut(u64, ReplyCode, (&[u8], &[u8])) -> Result<(), &'static str>,
) -> Result<usize, &'static str> {
    // SAFETY: the caller checked (is_reply_batch) that a whole header is there.
    let h = unsafe { ResponseHeader::read_from(record.as_ptr()) };
    let len = h.body_len as usize;
    if h.frag_offset != 0 || h.frag_len != h.body_len || len > record.len() - RESPONSE_HEADER_LEN {
        return Err("a reply batch longer than its record");
    }
    let entries = &record[RESPONSE_HEADER_LEN..RESPONSE_HEADER_LEN + len];
    let (mut offset, mut count) = (0usize, 0usize);
    while offset < len {
        if len - offset < COMPACT_REPLY_LEN {
            return Err("a compact reply header cut short");
        }
        // SAFETY: offset + COMPACT_REPLY_LEN <= len: a whole header inside `entries`.
        let r = unsafe { CompactReply::read_from(entries.as_ptr().add(offset)) };
        let (body_len, md_len) = (r.body_len as usize, usize::from(r.metadata_len));
        let body_at = offset + COMPACT_REPLY_LEN;
        if body_len > len - body_at || md_len > body_len || body_len > max_message {
            return Err("a compact reply longer than its batch");
        }
        let code = ReplyCode::from_wire8(r.status).ok_or("unknown status code")?;
        let body = &entries[body_at..body_at + body_len];
        each(u64::from(r.call_id), code, body.split_at(md_len))?;
        count += 1;
        offset = align8(body_at + body_len);
    }
    if count != h.reserved as usize {
        return Err("a reply batch holding another number of replies than it says");
    }
    Ok(count)
}

/// [`Pipeline::complete`] on the fields it touches (for loops that also borrow the client).
#[inline]
fn complete(
    slots: &mut [u32],
    free: &mut Vec<u32>,
    in_flight: &mut u32,
    kept: &mut KeptRuns,
    call_id: u64,
) {
    let index = Pipeline::slot(call_id);
    if let Some(slot) = slots.get_mut(index) {
        if *slot & BUSY != 0 {
            *slot &= !BUSY;
            free.push(index as u32);
            *in_flight = in_flight.saturating_sub(1);
            kept.answered(index);
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // An unpublished batch's blocks go back to the buffer.
        let shared: &Shared = self.client.shared();
        let table = shared.replica.table();
        if let Some(staged) = self.staged.take() {
            if staged.kept.is_none() {
                shared.lease.unclaim(table, staged.start, staged.blocks);
            }
        }
        // Kept runs with no request in flight go back now; the others the server frees
        // when it retires the connection (it may still be reading them).
        for run in self.kept.runs.iter().flatten().filter(|r| r.pending == 0) {
            shared.lease.unclaim(table, run.start, run.blocks);
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("service", &self.client.service())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `RESPONSE_BATCH` record as a server writes it: `(call id, status, metadata, payload)`.
    fn batch(replies: &[(u32, u8, &[u8], &[u8])]) -> Vec<u8> {
        let mut entries = Vec::new();
        for (id, status, md, payload) in replies {
            entries.resize(align8(entries.len()), 0);
            let r = CompactReply {
                call_id: *id,
                body_len: (md.len() + payload.len()) as u16,
                metadata_len: md.len() as u8,
                status: *status,
            };
            entries.extend_from_slice(r.as_bytes());
            entries.extend_from_slice(md);
            entries.extend_from_slice(payload);
        }
        let h = ResponseHeader {
            kind: kind::RESPONSE_BATCH,
            body_len: entries.len() as u32,
            frag_len: entries.len() as u32,
            reserved: replies.len() as u32,
            ..ResponseHeader::default()
        };
        let mut record = h.as_bytes().to_vec();
        record.extend_from_slice(&entries);
        record
    }

    /// Each reply's call id and outcome.
    type Delivered = Vec<(u64, Result<Vec<u8>, Status>)>;

    fn collect(record: &[u8]) -> Result<Delivered, &'static str> {
        let mut got = Vec::new();
        for_each_compact_reply(record, 1 << 20, |id, code, (md, rest)| {
            got.push((id, outcome(code, md, rest).map(<[u8]>::to_vec)));
            Ok(())
        })?;
        Ok(got)
    }

    #[test]
    fn compact_replies_come_out_in_order_with_their_outcomes() {
        let mut md = Vec::new();
        let mut m = Metadata::new();
        m.insert("k", "v");
        m.encode_into(&mut md);
        let record = batch(&[
            (1, 0, b"", b"one"),
            (2, 5, b"", b"no such thing"),
            (3, 0, &md, b"three, with metadata"),
            (4, 0, b"", b""),
        ]);
        assert!(is_reply_batch(&record));
        let got = collect(&record).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (1, Ok(b"one".to_vec())));
        assert_eq!(got[1].1.as_ref().unwrap_err().code(), Code::NotFound);
        assert_eq!(got[2], (3, Ok(b"three, with metadata".to_vec())));
        assert_eq!(got[3], (4, Ok(Vec::new())));
    }

    #[test]
    fn malformed_reply_batches_are_refused() {
        let good = batch(&[(1, 0, b"", b"one"), (2, 0, b"", b"two")]);
        // The record says it holds more bytes than it does.
        let mut long = good.clone();
        long[12..16].copy_from_slice(&10_000u32.to_le_bytes());
        long[20..24].copy_from_slice(&10_000u32.to_le_bytes());
        assert!(collect(&long).is_err());
        // A reply whose body runs past the batch.
        let mut past = good.clone();
        past[32 + 4..32 + 6].copy_from_slice(&5_000u16.to_le_bytes());
        assert!(collect(&past).is_err());
        // Metadata longer than the body.
        let mut md = good.clone();
        md[32 + 6] = 9;
        assert!(collect(&md).is_err());
        // An unknown status code.
        let mut status = good.clone();
        status[32 + 7] = 99;
        assert!(collect(&status).is_err());
        // A NOT_RUN bit on a code other than RESOURCE_EXHAUSTED.
        let mut status = good.clone();
        status[32 + 7] = 0x80 | Code::Internal as u8;
        assert!(collect(&status).is_err());
        // Another count than the replies it holds.
        let mut count = good.clone();
        count[28..32].copy_from_slice(&3u32.to_le_bytes());
        assert!(collect(&count).is_err());
        // A header cut short at the end.
        let mut cut = good.clone();
        cut.resize(32 + align8(cut.len() - 32), 0);
        cut.extend_from_slice(&[0; 4]);
        let len = (cut.len() - 32) as u32;
        cut[12..16].copy_from_slice(&len.to_le_bytes());
        cut[20..24].copy_from_slice(&len.to_le_bytes());
        assert!(collect(&cut).is_err());
        // Garbage metadata fails that call only.
        let bad_md = batch(&[(1, 0, &[0xff, 1, 2], b"x")]);
        let got = collect(&bad_md).unwrap();
        assert!(got[0].1.is_err());
        assert!(collect(&good).is_ok());
    }
}
