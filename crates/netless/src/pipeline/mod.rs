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
//!   than 8 of ours outstanding, so at low load there is no batching and no added latency.
//!   Otherwise it joins the open batch, which goes out when it holds `batch`, or at the
//!   caller's next `poll` once it holds an eighth of the requests the server still has of
//!   ours, or at `wait`/`flush`. A batch thus holds what the caller submitted while the
//!   server was busy (a caller behind its arrivals submits many between polls), and a caller
//!   keeping a deep window sends full batches even when it polls after every submit; a batch
//!   left short goes out as replies bring that eighth down to it. This is Nagle's rule with
//!   the caller's own poll for the acknowledgement: no timer, and no shared-memory read.
//!
//! - `calls`: the calls in flight and their ids; `batch`: writing and publishing batches;
//!   `kept`: the runs kept between batches.
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
#![deny(unsafe_code)]

use std::time::{Duration, Instant};

use crate::client::Client;
use crate::config::ClientConfig;
use crate::segment::layout::batch_mode;
use crate::status::Status;
use crate::sync::Ordering;
use crate::wire::bytes::same_bytes;
use crate::wire::header::{
    align64, align8, kind, wire_flags, ShortHeader, WireHeader, COMPACT_HEADER_LEN, HEADER_LEN,
    SHORT_HEADER_LEN,
};

mod batch;
mod calls;
mod kept;

use batch::{Batcher, Outgoing, Staged};
use calls::Calls;
use kept::KeptRuns;

/// Adaptive batching sends a request at once, alone, while the server has fewer than this
/// many of ours outstanding.
const ADAPTIVE_ALONE: u32 = 8;

/// Whether adaptive batching sends a request alone with `outstanding` of ours at the server.
#[inline(always)]
fn adaptive_alone(outstanding: u32) -> bool {
    outstanding < ADAPTIVE_ALONE
}

/// A connection of its own for pipelined calls from one thread: see the module docs.
pub struct Pipeline {
    client: Client,
    calls: Calls,
    batch: Batcher,
}

impl Pipeline {
    /// Opens a dedicated connection to `service` for pipelined calls; `config.max_in_flight`
    /// bounds the calls outstanding at once.
    pub fn connect(service: &str, config: ClientConfig) -> Result<Pipeline, Status> {
        let n = config.max_in_flight;
        let client = Client::connect_with(service, config)?;
        if client.connection().polled.is_some() {
            return Err(Status::unimplemented(format!(
                "a Pipeline needs the shared receive queue, which a software-coherent fabric \
                 does not have: call service `{service}` with a Client"
            )));
        }
        let max_run_bytes = client.connection().fragment_body + HEADER_LEN;
        let block = client.connection().replica.block_size();
        let short_runs = max_run_bytes.div_ceil(block) <= usize::from(u16::MAX);
        Ok(Pipeline {
            client,
            calls: Calls::new(n),
            batch: Batcher {
                staged: None,
                max_run_bytes,
                short_runs,
                batches: 0,
                batched: 0,
                last_batch: 1,
                staged_ids: Vec::new(),
                last_method: String::new(),
                kept: KeptRuns::new(n as usize),
            },
        })
    }

    /// The doorbell this pipeline's replies notify: a server whose handler forwards calls on
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
        self.calls.in_flight
    }

    /// Batches published so far, and the requests they held (their ratio is the mean
    /// batch size).
    pub fn batch_counts(&self) -> (u64, u64) {
        (self.batch.batches, self.batch.batched)
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

    /// Its connection, for fault injection (`crate::fault::steal_kept_tail`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The runs this pipeline keeps and holds no request in (fault injection).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn idle_kept_runs(&self) -> Vec<(u32, u32)> {
        let kept = &self.batch.kept;
        kept.idle
            .iter()
            .filter_map(|&id| kept.get(id))
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
        let batch = &mut self.batch;
        if batch.staged.is_some() || !batch.short_runs {
            return None;
        }
        let conn = self.client.connection();
        let ctrl = conn.replica.server_control();
        let body_len = method.len() + payload.len();
        let need = SHORT_HEADER_LEN + body_len;
        // A batch of one: batches of one request (B = 1), or adaptive batching at low load
        // (it publishes this one at once, alone).
        let alone = ctrl.batch_max.load(Ordering::Relaxed) <= 1
            || (adaptive_alone(self.calls.in_flight)
                && ctrl.batch_mode.load(Ordering::Relaxed) == batch_mode::ADAPTIVE);
        if !alone
            || method.len() > usize::from(u16::MAX)
            // `submit`'s limits, for a first request with a short header.
            || align64(align8(need)) > batch.max_run_bytes
            || body_len > conn.server_max_message
            || conn.dead.load(Ordering::Acquire)
            // Under an SLO requests carry stamps (full headers) and are admitted by depth.
            || crate::slo::admission::stamps(ctrl)
            || self.calls.all_busy()
        {
            return None;
        }
        let block = conn.replica.block_size();
        let used = need.div_ceil(block) as u32;
        let (id, run) = batch.kept.take_idle_prefix(conn, used)?;
        let index = self.calls.take_free().expect("a free slot, checked above");
        let call_id = self.calls.claim(index);
        let header = ShortHeader {
            token: conn.token,
            call_id,
            body_len: body_len as u32,
            method_len: method.len() as u16,
            flags: (wire_flags::BATCH_COMPACT | wire_flags::KEEP_BLOCKS) as u16,
            conn_index: conn.conn_index,
            kind: kind::REQUEST_SHORT,
            nblocks: used as u16,
        };
        // The run's first `used` blocks (take_idle_prefix gave a run of at least that many,
        // and checked those) are ours (OWNED, idle: no request of it in flight) and hold the
        // header and body.
        let written = conn.replica.run(run.start, used).is_some_and(|dst| {
            dst.write_after(0, *header.as_bytes(), &[method.as_bytes(), payload])
        });
        assert!(written, "a kept run holds a lone request");
        if !same_bytes(batch.last_method.as_bytes(), method.as_bytes()) {
            batch.last_method.clear();
            batch.last_method.push_str(method);
        }
        batch.staged_ids.push(call_id);
        self.calls.in_flight += 1;
        let out = Outgoing {
            start: run.start,
            used,
            count: 1,
            kept: Some(id),
        };
        batch.enqueue(conn, out, &mut self.calls.failed);
        Some(call_id)
    }

    /// `submit` for any request: the first of a batch, one naming its method, one that
    /// does not fit the open batch, or one that fails. Out of line, so that the common
    /// case (`submit_same`) is a small function.
    #[inline(never)]
    fn submit_any(&mut self, method: &str, payload: &[u8]) -> Result<u64, Status> {
        let conn = self.client.connection();
        if conn.is_dead() {
            return Err(conn.death_status());
        }
        let body_len = method.len() + payload.len();
        let ctrl = conn.replica.server_control();
        // A batch's first request takes a short header, or a full one where it needs a
        // field the short one lacks (an enqueue stamp, under an SLO); the rest take a compact
        // one, without the method's name when it repeats the request before it. A request
        // too large for a compact header's fields takes a batch's first place.
        let first_len = if self.batch.short_runs
            && method.len() <= usize::from(u16::MAX)
            && !crate::slo::admission::stamps(ctrl)
        {
            SHORT_HEADER_LEN
        } else {
            HEADER_LEN
        };
        let first_need = align8(first_len + body_len);
        let repeats = same_bytes(self.batch.last_method.as_bytes(), method.as_bytes());
        let compact_name = if repeats { 0 } else { method.len() };
        let compact_need = align8(COMPACT_HEADER_LEN + compact_name + payload.len());
        let compactable = compact_name <= usize::from(u8::MAX)
            && compact_name + payload.len() <= usize::from(u16::MAX);
        let max_run_bytes = self.batch.max_run_bytes;
        if align64(first_need) > max_run_bytes || body_len > conn.server_max_message {
            return Err(Status::invalid_argument(format!(
                "a pipelined request takes at most {max_run_bytes} bytes with its header, this one {first_need}: use Client::call for larger ones",
            )));
        }
        let Some(index) = self.calls.take_free() else {
            return Err(Status::resource_exhausted(format!(
                "{} calls already in flight on this pipeline: poll for replies first, or raise ClientConfig::max_in_flight",
                self.calls.len()
            )));
        };
        let batch_max = ctrl.batch_max.load(Ordering::Relaxed).clamp(1, 256);
        let adaptive = ctrl.batch_mode.load(Ordering::Relaxed) == batch_mode::ADAPTIVE;
        let block = conn.replica.block_size();
        if self.batch.staged.as_ref().is_some_and(|s| {
            s.count > 0 && (!compactable || s.used + compact_need > s.blocks as usize * block)
        }) {
            self.publish();
        }
        let conn = self.client.connection();
        if let Some(staged) = self.batch.staged.as_ref().filter(|s| s.count > 0) {
            // Under an SLO every request is admitted on its own: one joining an open batch
            // will queue behind that batch's requests as well as those already queued.
            if let Err(nack) = conn.check_depth(u64::from(staged.count)) {
                self.calls.give_back(index);
                return Err(nack);
            }
        }
        if self.batch.staged.is_none() {
            // Room for the batch this one will most likely end: the whole batch when fixed;
            // when adaptive, this request alone if it goes out alone (low load),
            // else twice the last batch (each slot claimed costs a CAS, so not `batch`
            // blindly, but a batch that filled its room may grow quickly).
            let in_flight = self.calls.in_flight;
            let room = if adaptive {
                if adaptive_alone(in_flight) {
                    1
                } else {
                    self.batch.last_batch.saturating_mul(2).clamp(1, batch_max)
                }
            } else {
                batch_max
            };
            if let Err(e) = self
                .batch
                .open(conn, first_need, compact_need, room, in_flight)
            {
                self.calls.give_back(index);
                return Err(e);
            }
        }
        let call_id = self.calls.claim(index);
        let staged = self.batch.staged.as_mut().expect("a batch is open");
        let run = conn
            .replica
            .run(staged.start, staged.blocks)
            .expect("a claimed run lies inside the buffer");
        if staged.count == 0 {
            // Written when the batch is published.
            staged.first = WireHeader {
                token: conn.token,
                call_id,
                conn_index: conn.conn_index,
                kind: kind::REQUEST,
                body_len: body_len as u32,
                frag_len: body_len as u32,
                method_len: method.len() as u32,
                reserved: [wire_flags::BATCH_COMPACT, 0],
                ..WireHeader::default()
            };
            staged.first_len = first_len;
            // The run is ours (OWNED, unpublished) and `first_need` bytes fit in it
            // (`Batcher::open`): the header's room, then the body.
            let written = run.write(staged.used + first_len, &[method.as_bytes(), payload]);
            assert!(written, "a new batch's run holds its first request");
            staged.last = staged.used;
            staged.used += first_need;
            staged.count = 1;
        } else {
            // `compactable` (or the batch would have been published): the fields fit; and
            // `used + compact_need` fits in the run (checked above).
            let written = staged.write_compact(run, call_id, method, payload, repeats);
            assert!(written, "an open batch's run holds what fits it");
        }
        if !repeats {
            self.batch.last_method.clear();
            self.batch.last_method.push_str(method);
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
        let conn = self.client.connection();
        let batch = &mut self.batch;
        let staged = batch.staged.as_ref()?;
        let need = align8(COMPACT_HEADER_LEN + payload.len());
        let ctrl = conn.replica.server_control();
        if staged.count == 0
            || !same_bytes(method.as_bytes(), batch.last_method.as_bytes())
            || payload.len() > usize::from(u16::MAX)
            || staged.used + need > staged.blocks as usize * conn.replica.block_size()
            // `submit`'s limits, with the longer of a first request's headers.
            || align64(align8(HEADER_LEN + method.len() + payload.len())) > batch.max_run_bytes
            || method.len() + payload.len() > conn.server_max_message
            || conn.dead.load(Ordering::Acquire)
            // Under an SLO every request is admitted on its own.
            || ctrl.depth_limit.load(Ordering::Relaxed) != 0
        {
            return None;
        }
        let index = self.calls.take_free()?;
        let call_id = self.calls.claim(index);
        let staged = batch.staged.as_mut().expect("the open batch checked above");
        let run = conn
            .replica
            .run(staged.start, staged.blocks)
            .expect("a claimed run lies inside the buffer");
        // The batch holds a request, the fields fit a compact header and `used + need` fits
        // in the run (all checked above).
        let written = staged.write_compact(run, call_id, method, payload, true);
        assert!(written, "an open batch's run holds what fits it");
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
        self.batch.staged_ids.push(call_id);
        self.calls.in_flight += 1;
        let count = self.batch.staged.as_ref().map_or(0, |s| s.count);
        if count >= batch_max || (adaptive && adaptive_alone(self.calls.in_flight - count)) {
            self.publish();
        }
    }

    /// Publishes the batch being written, if any (fixed batching waits for a full batch
    /// otherwise).
    pub fn flush(&mut self) {
        self.publish();
    }

    /// Publishes the open batch, if any (see [`Batcher::publish`]).
    fn publish(&mut self) {
        self.batch
            .publish(self.client.connection(), &mut self.calls.failed);
    }

    /// Delivers every reply that has arrived to `on_reply(call_id, reply)`, without waiting,
    /// and returns how many. With adaptive batching it first publishes the batch waiting.
    /// `Err` only when the connection is gone or the server wrote garbage (the connection is
    /// then closed); outstanding calls are lost with it.
    pub fn poll(
        &mut self,
        mut on_reply: impl FnMut(u64, Result<&[u8], Status>),
    ) -> Result<usize, Status> {
        let mut delivered = 0;
        for (id, status) in std::mem::take(&mut self.calls.failed) {
            on_reply(id, Err(status));
            self.calls.complete(&mut self.batch.kept, id);
            delivered += 1;
        }
        if let Some(staged) = &self.batch.staged {
            let adaptive = self
                .client
                .connection()
                .replica
                .server_control()
                .batch_mode
                .load(Ordering::Relaxed)
                == batch_mode::ADAPTIVE;
            if adaptive && staged.count >= self.adaptive_target() {
                self.publish();
            }
        }
        let conn = self.client.connection();
        let taken = self
            .calls
            .take_replies(conn, &mut self.batch.kept, &mut on_reply)?;
        delivered += taken;
        if delivered == 0 && conn.is_dead() {
            return Err(conn.death_status());
        }
        Ok(delivered)
    }

    /// Publishes any batch being written, then waits (per the client's wait policy) until a
    /// reply has arrived, `timeout` passes (`None`: as long as the server lives) or the
    /// connection dies. Returns at once if nothing is in flight.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<(), Status> {
        self.publish();
        if self.calls.in_flight == 0 || !self.calls.failed.is_empty() {
            return Ok(());
        }
        let conn = self.client.connection();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let ready = netless_ring::wait(
            conn.doorbell(),
            &conn.config.wait,
            deadline,
            Duration::from_millis(100),
            || {
                let has = conn.consumer.try_lock().is_some_and(|c| c.has_next());
                (has || conn.is_dead()).then_some(())
            },
        );
        if conn.is_dead() {
            return Err(conn.death_status());
        }
        ready.map_err(|_| Status::deadline_exceeded("no reply arrived within the timeout"))
    }

    /// The adaptive batch a poll publishes at: an eighth of the requests the server has of
    /// ours (published, not answered), at least 1. A caller keeping many calls in flight thus
    /// sends them in batches of up to `batch` even if it polls after every submit, and a
    /// batch left short goes out as replies bring the target down to it.
    fn adaptive_target(&self) -> u32 {
        let staged = self.batch.staged.as_ref().map_or(0, |s: &Staged| s.count);
        ((self.calls.in_flight - staged) / 8).max(1)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // An unpublished batch's blocks go back to the buffer.
        let conn = self.client.connection();
        let table = conn.replica.table();
        if let Some(staged) = self.batch.staged.take() {
            if staged.kept.is_none() {
                conn.lease.unclaim(table, staged.start, staged.blocks);
            }
        }
        // Kept runs with no request in flight go back now; the others the server frees
        // when it retires the connection (it may still be reading them).
        for run in self.batch.kept.iter().filter(|r| r.pending == 0) {
            conn.lease.unclaim(table, run.start, run.blocks);
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("service", &self.client.service())
            .field("in_flight", &self.calls.in_flight)
            .finish()
    }
}
