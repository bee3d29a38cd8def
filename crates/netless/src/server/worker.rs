//! A worker thread: takes entries from each trust group's receive queue (single-queue
//! dispatch, or its own queue when partitioned), taking turns between groups, sleeps on the
//! queues' doorbells (and its handler's wake sources) when they run dry, and hands each entry
//! to its [`WorkerContext`] to serve.
//!
//! A [`Worker`] owns everything one thread needs (its context, its cache of the connection
//! table), so nothing is passed from call to call; its [`WorkerSlot`] is the one part other
//! threads read (the acceptor, before it frees a dead connection's blocks).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use netless_ring::prefetch::{prefetch_read, prefetch_read_range};
use netless_ring::{ConsumerHead, Dequeue};

use super::backlog::BACKLOG_POLL;
use super::conn::{Conn, ConnCache};
use super::group::Group;
use super::notify::NotifySection;
use super::reply::Outbox;
use super::state::ServerState;
use crate::config::Dispatch;
use crate::segment::layout::{batch_bucket, bump, latency_bucket, WorkerStats};
use crate::segment::replica::QueueView;
use crate::segment::WakeSource;
use crate::slo::admission::ShedGate;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::wire::metadata::Metadata;

/// [`WorkerSlot::serving`]: serving nothing.
pub(super) const IDLE: u32 = 0;
/// [`WorkerSlot::serving`]: between taking a queue entry and knowing its connection.
pub(super) const BUSY: u32 = u32::MAX;

/// What one worker is doing, and its counters: written only by that worker (plain stores,
/// no locked instructions on the hot path), read by the acceptor and `stats`. Padded to its
/// own cache line.
#[repr(align(64))]
#[derive(Default)]
pub(super) struct WorkerSlot {
    /// [`IDLE`], [`BUSY`], or the tag of the connection whose request it is serving.
    pub(super) serving: AtomicU32,
    /// `BUSY` while the worker holds a second, prefetched queue entry (`Dispatch::Jbsq2`).
    pub(super) held: AtomicU32,
    /// Requests measured into `busy_ns`.
    pub(super) measured: AtomicU64,
    /// Nanoseconds spent serving requests (measured only for an SLO without a declared
    /// service time).
    pub(super) busy_ns: AtomicU64,
}

/// What a worker serves calls with: the server, its own slot and stats, its reusable
/// buffers, the SLO gate and the replies it has yet to send.
pub(super) struct WorkerContext<'a> {
    pub(super) server: &'a ServerState,
    /// The trust group whose queue entry is being served.
    pub(super) group: &'a Group,
    pub(super) slot: &'a WorkerSlot,
    pub(super) stats: &'a WorkerStats,
    /// Reused by each call's `ResponseBuilder`, so a steady stream of calls allocates nothing.
    pub(super) metadata: Metadata,
    pub(super) payload: Vec<u8>,
    /// The method of the last request served (a private, validated copy).
    pub(super) method: String,
    /// Whether `method` is one of the runtime's own (`netless.ctl/`), kept with it.
    pub(super) method_is_control: bool,
    /// Requests in the queue entry just served (a batch holds several).
    pub(super) batch: u32,
    /// Entries served so far (every 16th is timed; every 1024th renews the SLO gate).
    pub(super) served: u64,
    /// How long the entry being served had waited when the worker started it, µs, if too
    /// long to finish within the SLO: its requests are refused without running.
    pub(super) refused: Option<u32>,
    pub(super) shed: ShedGate,
    pub(super) outbox: Outbox<'a>,
}

/// A worker's running estimate of requests per queue entry (batches hold several), which
/// it publishes in `ServerControl::requests_per_entry_x16` for clients to scale the queue's
/// depth by: an exponential average over the last few dozen entries, stored only when it
/// moved by an eighth of a request or more, so the line clients read stays put.
struct PerEntry {
    /// The average, in 1024ths of a request (fine enough that the integer average converges).
    x1024: i64,
    /// What this worker last published, in sixteenths.
    published: u32,
}

impl Default for PerEntry {
    fn default() -> Self {
        PerEntry {
            x1024: 1024,
            published: 0,
        }
    }
}

impl PerEntry {
    #[inline(always)]
    fn observe(&mut self, requests: u32, shared: &AtomicU32) {
        let sample = i64::from(requests.clamp(1, 256)) * 1024;
        if sample == self.x1024 && self.published != 0 {
            // Steady (lone requests at B=1): nothing moves.
            return;
        }
        // x += (sample - x) / 16: a mean over the last few dozen entries.
        self.x1024 += (sample - self.x1024) / 16;
        let x16 = ((self.x1024 + 32) / 64).clamp(16, 16 * 256) as u32;
        if x16.abs_diff(self.published) >= 2 {
            self.published = x16;
            shared.store(x16, Ordering::Relaxed);
        }
    }
}

/// One receive queue a worker takes entries from: queue `q` of a trust group.
#[derive(Clone, Copy)]
struct Lane<'a> {
    group: &'a Group,
    view: &'a QueueView,
    head: &'a ConsumerHead,
}

/// One worker thread's state.
pub(super) struct Worker<'a> {
    pub(super) cx: WorkerContext<'a>,
    pub(super) conns: ConnCache,
    /// This worker's number (its slot, its stats, its queue when partitioned).
    index: usize,
}

/// Runs worker `index` of `server` until the server stops.
pub(super) fn run(server: Arc<ServerState>, index: usize) {
    let config = &server.config;
    if !config.pin_cpus.is_empty() {
        let cpu = config.pin_cpus[index % config.pin_cpus.len()];
        if let Err(e) = netless_shm::pin_current_thread(cpu) {
            tracing::warn!("cannot pin worker {index} to cpu {cpu}: {e}");
        }
    }
    let stats = &server.control.stats()[index];
    let Some(first) = server.groups.get(0) else {
        return;
    };
    let mut worker = Worker {
        cx: WorkerContext {
            server: &server,
            group: first,
            slot: &server.workers[index],
            stats,
            metadata: Metadata::new(),
            payload: Vec::new(),
            method: String::new(),
            method_is_control: false,
            batch: 0,
            served: 0,
            refused: None,
            shed: ShedGate::default(),
            outbox: Outbox::new(&server, stats),
        },
        conns: ConnCache::new(&server.conns),
        index,
    };
    worker.serve_queues();
}

impl<'a> Worker<'a> {
    /// Serves every trust group's queue until the server stops, starting over whenever a
    /// group is added.
    fn serve_queues(&mut self) {
        let server = self.cx.server;
        // Partitioned dispatch: worker w alone drains queue w; otherwise all share queue 0.
        let q = self.index % server.spec.nqueues as usize;
        while !server.is_stopping() {
            let lanes: Vec<Lane<'a>> = server
                .groups
                .iter()
                .map(|group| {
                    let (view, head) = group.queue(q);
                    Lane { group, view, head }
                })
                .collect();
            self.serve_lanes(&lanes);
        }
    }

    /// The worker's loop: take an entry, serve it, poll the handler; sleep when the queues
    /// run dry. Returns when the server stops or gains a trust group.
    fn serve_lanes(&mut self, lanes: &[Lane<'a>]) {
        let server = self.cx.server;
        let worker = self.index;
        // The lane served last: its queue is tried first, and it holds the second entry.
        let cur = Cell::new(0usize);
        let nlanes = lanes.len();
        let me = self.cx.slot;
        let single = server.workers.len() / server.spec.nqueues as usize == 1;
        let jbsq2 = server.config.dispatch == Dispatch::Jbsq2;
        let measure = server.config.slo.is_some_and(|s| s.mean_service.is_none());
        let stats = self.cx.stats;
        let control = server.server_control();
        let mut sleeps = 0u64;
        let mut per_entry = PerEntry::default();
        let mut polls = 0u32;
        // Whether the last turn of the loop served an entry.
        let mut busy = false;
        // Every lane's doorbell, then the handler's own sources.
        let sources = server.handler.wake_sources(worker);
        if nlanes + sources.len() > netless_ring::WAIT_ANY_MAX {
            tracing::warn!(
                "worker {worker}: {nlanes} queues and {} wake sources of the handler; only the \
                 first {} wake it (the rest are polled, at least every 100 ms)",
                sources.len(),
                netless_ring::WAIT_ANY_MAX
            );
        }
        let doorbells: Vec<&netless_ring::DoorbellWords> = lanes
            .iter()
            .map(|lane| lane.view.doorbell())
            .chain(sources.iter().map(WakeSource::doorbell))
            .collect();
        let handler_polls = server.handler.polls();
        // Runs of lone requests served in one go (`serve_lone_run`): with one consumer per
        // queue and no second entry held, and unless every request's time is measured.
        let lone_runs = single && !jbsq2 && !measure;
        let handler_poll = || {
            if !handler_polls {
                return false;
            }
            let _notify = NotifySection::enter();
            server.handler.poll(worker)
        };
        // Jbsq2: a second entry taken (and its payload prefetched) while serving the first,
        // with its lane.
        let mut next: Option<(u32, usize)> = None;
        // Takes the next entry of `lane`, if any; `hold` marks the worker so reclamation
        // waits for it.
        let take_from = |lane: &Lane<'a>, full_check: bool, hold: bool| -> Option<u32> {
            let (group, view, head) = (lane.group, lane.view, lane.head);
            let queue = view.queue();
            // Before the entry is taken: say so (reclamation waits for BUSY workers), and
            // start fetching the request while the claim waits for the cell.
            let on_full = |block: u32| {
                if hold {
                    me.held.store(BUSY, Ordering::Relaxed);
                } else {
                    me.serving.store(BUSY, Ordering::Relaxed);
                }
                if let Some(first) = group.replica.run(block, 1) {
                    prefetch_read_range(first.as_ptr(), 2 * 64, 2);
                }
                // For reading only: the worker validates it, and its store of FREE (if the
                // client does not keep the run) waits in the store buffer, stalling nothing;
                // taking the line exclusive would rob a client checking its kept runs.
                if let Some(word) = group.replica.table().get(block as usize) {
                    prefetch_read((word as *const AtomicU32).cast());
                }
            };
            let dequeued = if single {
                queue.try_dequeue_single_consumer(head, full_check, on_full)
            } else {
                queue.try_dequeue_with(head, full_check, on_full)
            };
            let idle = if hold { &me.held } else { &me.serving };
            // The head is published for clients' queue-depth checks (SLO NACKs, replica
            // choice). With several workers a preempted one can publish an older head after
            // a newer one; an idle worker republishes it, or clients refused on a stale depth
            // would never enqueue (nor notify) again and the server would sit idle for good.
            let publish = || {
                let now = head.position();
                if view.head().position.load(Ordering::Relaxed) != now {
                    view.head().position.store(now, Ordering::Relaxed);
                }
            };
            match dequeued {
                Dequeue::Item(block) => {
                    view.head()
                        .position
                        .store(head.position(), Ordering::Relaxed);
                    Some(block)
                }
                Dequeue::Skipped => {
                    publish();
                    idle.store(IDLE, Ordering::Release);
                    server.dropped.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Dequeue::Empty => {
                    publish();
                    // on_full may have run for an entry another worker won.
                    if !single {
                        idle.store(IDLE, Ordering::Release);
                    }
                    None
                }
            }
        };
        // Takes the next entry of any lane, the current one's first.
        let take = |full_check: bool| -> Option<u32> {
            if nlanes == 1 {
                return take_from(&lanes[0], full_check, false);
            }
            let start = cur.get();
            for k in 0..nlanes {
                let i = (start + k) % nlanes;
                if let Some(block) = take_from(&lanes[i], full_check, false) {
                    cur.set(i);
                    return Some(block);
                }
            }
            None
        };
        while !server.is_stopping() {
            let block = match next.take() {
                Some((block, lane)) => {
                    cur.set(lane);
                    me.serving.store(BUSY, Ordering::Relaxed);
                    me.held.store(IDLE, Ordering::Release);
                    Some(block)
                }
                // While entries keep coming, the next one is taken straight away: the wait
                // (its soft registers and bookkeeping) is for a queue that ran dry.
                None if busy && let Some(block) = take(false) => Some(block),
                None => {
                    // Handles on connections retired meanwhile go, so their memory can (and a
                    // retirement during the wait ends it, to come back here).
                    self.conns.prune(&server.conns);
                    let retired = server.conns.retirements();
                    // The soft registers, read on every wait: `netless ctl` changes apply at
                    // once.
                    let wait = crate::control::wait_policy(control);
                    let futex_only = wait.mode == netless_ring::WaitMode::Futex;
                    let before = sleeps;
                    // Clients make room in their rings unannounced: while replies wait for
                    // it, sleep little (`backlog.rs`).
                    let backlogged = server.backlogs.any();
                    let max_sleep = if backlogged {
                        server.max_sleep().min(BACKLOG_POLL)
                    } else {
                        server.max_sleep()
                    };
                    let item = netless_ring::wait_any_counted(
                        &doorbells,
                        &wait,
                        None,
                        max_sleep,
                        &mut sleeps,
                        || {
                            polls = polls.wrapping_add(1);
                            if server.is_stopping()
                                || server.groups.count() != nlanes
                                || server.conns.retirements() != retired
                            {
                                return Some(None);
                            }
                            // Most polls read only the next cell; every 256th also checks
                            // for holes, which reads the tail clients write. (In futex mode
                            // a worker polls once per wake-up, so it checks every time.)
                            let taken = take(futex_only || polls.is_multiple_of(256)).map(Some);
                            // Replies waiting for a slow client's ring, while there is time.
                            server.backlogs.drain(server);
                            // The handler's own work counts as something done: no sleep. A
                            // backlog that began meanwhile ends a long wait, for a short one.
                            if taken.is_none()
                                && (handler_poll() || (!backlogged && server.backlogs.any()))
                            {
                                return Some(None);
                            }
                            taken
                        },
                    );
                    if sleeps != before {
                        bump(&stats.sleeps, sleeps - before);
                    }
                    item.ok().flatten()
                }
            };
            busy = block.is_some();
            let Some(mut block) = block else {
                if server.groups.count() != nlanes {
                    break;
                }
                continue;
            };
            let lane = &lanes[cur.get()];
            self.cx.group = lane.group;
            let (queue, head) = (lane.view.queue(), lane.head);
            let lone = if lone_runs {
                super::lone::lone_header(lane.group, block)
            } else {
                None
            };
            if let Some(first) = lone {
                // Only this lane's entries: the run serves one connection.
                let take_next = || take_from(lane, false, false);
                let (rest, n) = self.serve_lone_run(block, first, &take_next, &handler_poll);
                if n != 0 {
                    bump(&stats.batch[batch_bucket(1)], u64::from(n));
                    per_entry.observe(1, &control.requests_per_entry_x16);
                }
                match rest {
                    Some(other) => block = other,
                    None => {
                        me.serving.store(IDLE, Ordering::Release);
                        server.backlogs.drain(server);
                        if nlanes > 1 {
                            // Groups take turns.
                            cur.set((cur.get() + 1) % nlanes);
                        }
                        // A full run: the queue is busy, so the worker may not wait (where
                        // it looks for new groups) for a while; look now.
                        if n == super::lone::LONE_RUN && server.groups.count() != nlanes {
                            break;
                        }
                        continue;
                    }
                }
            }
            if jbsq2 {
                // From the next lane that has one, this lane's last: groups take turns entry
                // by entry, the second entry included, so a group that keeps its queue full
                // cannot keep the worker to itself.
                next = (1..=nlanes).find_map(|k| {
                    let i = (cur.get() + k) % nlanes;
                    take_from(&lanes[i], true, true).map(|b| (b, i))
                });
                if let Some((b, i)) = next {
                    // The second request's payload, while the first runs.
                    let replica = &lanes[i].group.replica;
                    if let Some(run) = replica.run(b, 1) {
                        prefetch_read_range(run.as_ptr(), replica.block_size().max(256), 4);
                    }
                }
            }
            bump(&stats.entries, 1);
            // Latency is sampled (every 16th request) unless the SLO needs every one.
            self.cx.served += 1;
            let served = self.cx.served;
            let started = (measure || served.is_multiple_of(16)).then(Instant::now);
            self.cx.batch = 1;
            if served.is_multiple_of(1024) {
                // The measured service time moves: recompute the bound of a request's wait.
                self.cx.shed.renew();
            }
            let behind = || next.is_some() || queue.len_hint(head) > 0;
            self.serve(block, &behind);
            let batch = self.cx.batch;
            bump(&stats.batch[batch_bucket(batch)], 1);
            per_entry.observe(batch, &control.requests_per_entry_x16);
            if let Some(t) = started {
                let ns = t.elapsed().as_nanos() as u64;
                bump(&stats.latency[latency_bucket(ns)], 1);
                if measure && self.cx.refused.is_none() {
                    // Per request: an entry may be a batch of several. (Refused entries,
                    // which ran nothing, would make the service look faster than it is.)
                    bump(&me.busy_ns, ns);
                    bump(&me.measured, u64::from(batch.max(1)));
                }
            }
            me.serving.store(IDLE, Ordering::Release);
            // A busy queue must not starve the handler's own work, nor a slow client's
            // backlogged replies.
            handler_poll();
            server.backlogs.drain(server);
            if nlanes > 1 && next.is_none() {
                // Groups take turns.
                cur.set((cur.get() + 1) % nlanes);
            }
            // Every 16th entry (the sampled ones): a busy worker may not wait, where it looks
            // for new groups, for a while.
            if started.is_some() && next.is_none() && server.groups.count() != nlanes {
                break;
            }
        }
        if next.is_some() {
            me.held.store(IDLE, Ordering::Release);
        }
    }

    /// Validates and serves the request whose run starts at `block`. `behind`: whether
    /// other entries wait behind this one (read only if it is late).
    fn serve(&mut self, block: u32, behind: &dyn Fn() -> bool) {
        let (server, group) = (self.cx.server, self.cx.group);
        let Some(first) = group.replica.run(block, 1) else {
            server.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let (h, header_len) = first.request_header();
        // Under an SLO, entries carry the time they were enqueued (`crate::slo::admission`).
        let stamp = h.reserved[1];
        self.cx.refused = None;
        if stamp != 0 {
            self.cx.refused = self.cx.waited_too_long(stamp).filter(|_| behind());
        }
        let Some(conn) = self.conns.lookup(&server.conns, h.conn_index) else {
            server.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // From here until the worker goes IDLE, the connection's blocks are not reclaimed.
        self.cx.slot.serving.store(conn.tag, Ordering::Relaxed);
        if h.token != conn.token || conn.is_dead() || conn.group != group.index {
            server.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Err(why) = self.cx.serve_conn(conn, block, &h, header_len) {
            server.violated(conn, why);
        }
    }
}

impl WorkerContext<'_> {
    /// How long an entry stamped `stamp` waited, if too long to finish within the SLO (see
    /// [`ShedGate`]). The caller refuses it only if others wait behind it: refusing the last
    /// one would gain no one anything (and a worker woken from sleep by a lone request may
    /// well be late for it).
    fn waited_too_long(&mut self, stamp: u32) -> Option<u32> {
        let server = self.server;
        self.shed
            .waited_too_long(server.server_control(), stamp, || server.service_time())
    }

    /// Marks this worker as serving `conn` (its blocks are not reclaimed meanwhile).
    #[inline(always)]
    pub(super) fn serving(&self, conn: &Conn) {
        self.slot.serving.store(conn.tag, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_per_entry_follow_the_batches_and_publish_only_changes() {
        let shared = AtomicU32::new(0);
        let mut estimate = PerEntry::default();
        estimate.observe(1, &shared);
        assert_eq!(shared.load(Ordering::Relaxed), 16, "one request per entry");
        for _ in 0..200 {
            estimate.observe(4, &shared);
        }
        let four = shared.load(Ordering::Relaxed);
        assert!((60..=64).contains(&four), "batches of 4: {four}");
        // Steady batches leave the published value alone.
        shared.store(12345, Ordering::Relaxed);
        for _ in 0..50 {
            estimate.observe(4, &shared);
        }
        assert_eq!(shared.load(Ordering::Relaxed), 12345);
        for _ in 0..200 {
            estimate.observe(1, &shared);
        }
        let one = shared.load(Ordering::Relaxed);
        assert!((16..=17).contains(&one), "back to single requests: {one}");
    }
}
