//! The load generators of `batching`: one [`Driver`] per client thread owns a
//! [`Pipeline`] and runs measured windows on it, closed loop (the window of calls kept full,
//! for throughput) or open loop (Poisson arrivals at a target rate, for latency against
//! offered load). It only sends, receives, checks and counts: which batching setting is in
//! force, and where the thread runs, is the caller's business.

use std::time::Duration;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{Client, ClientConfig, Pipeline, ReplicaStats, WaitMode, WaitPolicy};

use super::{METHOD, PAYLOAD_BYTES};
use crate::harness::clock::{Mark, Stopwatch};
use crate::harness::histogram::new_histogram;
use crate::harness::noise::thread_preemptions;
use crate::harness::stats::median;

/// How long a drain (collecting the replies still in flight after a window) may take before
/// the server counts as hung.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// A client thread's pipelined connection and what it needs to time and check calls.
pub(super) struct Driver {
    pipe: Pipeline,
    watch: Stopwatch,
    /// Calls kept in flight at most (the pipeline's `max_in_flight`).
    window: u32,
    /// Yield the CPU when a poll finds nothing (for a thread that shares its core with a
    /// server worker) instead of spinning.
    yield_when_idle: bool,
    payload: [u8; PAYLOAD_BYTES],
    /// Per call slot (the low half of a call id): the scheduled send time of its call, in ns
    /// since the open-loop window's origin.
    scheduled: Vec<u64>,
    /// Call slots delivered by the last poll, with whether the reply was right.
    delivered: Vec<(u32, bool)>,
    /// The first wrong reply, if any (every reply is checked).
    bad: Option<String>,
}

/// Counters at the start or end of a measured window.
struct Snapshot {
    ns: u64,
    batch_counts: (u64, u64),
    server: Option<ReplicaStats>,
}

impl Snapshot {
    fn take(driver: &Driver, ns: u64, stats: Option<&Client>) -> Snapshot {
        Snapshot {
            ns,
            batch_counts: driver.pipe.batch_counts(),
            server: stats.map(Client::replica_stats),
        }
    }
}

/// What a measured window counted, besides latencies.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counts {
    /// Replies received in the window.
    pub calls: u64,
    /// Length of the window, ns.
    pub ns: u64,
    /// Batches this client published in the window, and the requests they held.
    pub batches: u64,
    pub batched: u64,
    /// Queue entries the server took in the window and the requests it answered (all
    /// clients; zero unless asked for).
    pub server_entries: u64,
    pub server_calls: u64,
    /// Times the client thread was preempted (involuntary context switches) from the start
    /// of the warm-up to the end of the drain: other processes taking its core.
    pub preempted: u64,
}

impl Counts {
    fn between(a: &Snapshot, b: &Snapshot, calls: u64) -> Counts {
        let (server_entries, server_calls) = match (&a.server, &b.server) {
            (Some(x), Some(y)) => (
                y.entries.wrapping_sub(x.entries),
                y.calls.wrapping_sub(x.calls),
            ),
            _ => (0, 0),
        };
        Counts {
            calls,
            ns: b.ns.saturating_sub(a.ns),
            batches: b.batch_counts.0.wrapping_sub(a.batch_counts.0),
            batched: b.batch_counts.1.wrapping_sub(a.batch_counts.1),
            server_entries,
            server_calls,
            preempted: 0,
        }
    }

    /// Adds another window's (or thread's) counts; lengths add too.
    pub(super) fn merge(&mut self, o: &Counts) {
        self.calls += o.calls;
        self.ns += o.ns;
        self.batches += o.batches;
        self.batched += o.batched;
        self.server_entries += o.server_entries;
        self.server_calls += o.server_calls;
        self.preempted += o.preempted;
    }

    /// Replies per second.
    pub(super) fn rate(&self) -> f64 {
        if self.ns == 0 {
            0.0
        } else {
            self.calls as f64 * 1e9 / self.ns as f64
        }
    }
}

/// Requests per batch (0 when there were none).
pub(super) fn mean(requests: u64, batches: u64) -> f64 {
    if batches == 0 {
        0.0
    } else {
        requests as f64 / batches as f64
    }
}

/// An open-loop window: counts and the latency of every call scheduled in it.
pub(super) struct OpenWindow {
    pub counts: Counts,
    /// Scheduled send time to reply, ns, of the calls scheduled in the window.
    pub latency: Histogram<u64>,
    /// Scheduled send time to actual send, ns (the generator's and the window's lag).
    pub send_lag: Histogram<u64>,
    /// Arrivals scheduled in the window.
    pub scheduled: u64,
    /// Of those, the ones never sent (the client was still behind when the window closed).
    pub unsent: u64,
}

/// Uniform and exponential variates from SplitMix64: fast, seedable, good enough for
/// inter-arrival gaps.
pub(super) struct Arrivals {
    state: u64,
    mean_gap_ns: f64,
}

impl Arrivals {
    /// Gaps of a Poisson process of `rate_per_s` arrivals a second.
    pub(super) fn new(seed: u64, rate_per_s: f64) -> Arrivals {
        Arrivals {
            state: seed,
            mean_gap_ns: 1e9 / rate_per_s,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next inter-arrival gap, ns (exponentially distributed).
    pub(super) fn gap_ns(&mut self) -> f64 {
        // Uniform in (0, 1]: never ln(0).
        let u = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        -u.ln() * self.mean_gap_ns
    }
}

impl Driver {
    /// Opens a pipelined connection to `service` in `dir` with `window` calls in flight at
    /// most, its calls to come from `cpu` (when known); its waits spin (the thread has a
    /// core) unless `yield_when_idle`.
    pub(super) fn connect(
        service: &str,
        dir: &std::path::Path,
        (window, cpu): (u32, Option<usize>),
        watch: Stopwatch,
        yield_when_idle: bool,
    ) -> anyhow::Result<Driver> {
        let config = ClientConfig {
            dir: Some(dir.to_path_buf()),
            max_in_flight: window,
            ring_bytes: 1 << 20,
            wait: spin_policy(),
            cpu,
            ..Default::default()
        };
        let pipe = Pipeline::connect(service, config)
            .with_context(|| format!("opening a pipeline to `{service}`"))?;
        let mut payload = [0u8; PAYLOAD_BYTES];
        for (i, b) in payload.iter_mut().enumerate() {
            *b = i as u8 ^ 0xa5;
        }
        Ok(Driver {
            pipe,
            watch,
            window,
            yield_when_idle,
            payload,
            scheduled: vec![0; window as usize],
            delivered: Vec::with_capacity(window as usize),
            bad: None,
        })
    }

    /// Submits until `window` calls are in flight (or the server's buffer refuses one).
    fn fill(&mut self) -> anyhow::Result<()> {
        while self.pipe.in_flight() < self.window {
            match self.pipe.submit(METHOD, &self.payload) {
                Ok(_) => {}
                // The receive buffer or queue is full: replies free it.
                Err(e) if e.is_nack() => break,
                Err(e) => return Err(e).context("submitting a pipelined call"),
            }
        }
        Ok(())
    }

    /// Delivers the replies that have arrived into `self.delivered`, checking each.
    fn poll(&mut self) -> anyhow::Result<usize> {
        let Driver {
            pipe,
            payload,
            delivered,
            bad,
            ..
        } = self;
        delivered.clear();
        let n = pipe
            .poll(|id, reply| {
                let ok = match reply {
                    Ok(bytes) if bytes == &payload[..] => true,
                    Ok(bytes) => {
                        bad.get_or_insert_with(|| {
                            format!("an echo came back as {} different bytes", bytes.len())
                        });
                        false
                    }
                    Err(status) => {
                        bad.get_or_insert_with(|| format!("a call failed: {status}"));
                        false
                    }
                };
                delivered.push((Pipeline::slot(id) as u32, ok));
            })
            .context("polling the pipeline")?;
        if let Some(why) = &self.bad {
            bail!("{why}");
        }
        Ok(n)
    }

    /// Collects every reply still in flight (publishing a batch left open), handing each
    /// delivered slot to `on_reply` with the time it was seen.
    fn drain(&mut self, origin: Mark, mut on_reply: impl FnMut(u32, u64)) -> anyhow::Result<()> {
        let limit = DRAIN_LIMIT.as_nanos() as u64;
        let started = self.watch.elapsed_ns(origin);
        self.pipe.flush();
        while self.pipe.in_flight() > 0 {
            let n = self.poll()?;
            let now = self.watch.elapsed_ns(origin);
            for &(slot, _) in &self.delivered {
                on_reply(slot, now);
            }
            if n == 0 {
                if now - started > limit {
                    bail!(
                        "{} calls still unanswered {DRAIN_LIMIT:?} after the window closed",
                        self.pipe.in_flight()
                    );
                }
                self.pipe.flush();
                if self.yield_when_idle {
                    std::thread::yield_now();
                }
            }
        }
        Ok(())
    }

    /// The host's pace (see the module docs of `batching`): the median round trip, ns, of
    /// `calls` lone calls, each published at once and waited for with nothing else in flight.
    pub(super) fn lone_call_ns(&mut self, calls: u32) -> anyhow::Result<f64> {
        if self.pipe.in_flight() != 0 {
            // A reply to an earlier call would end a lone call's wait early.
            bail!(
                "{} calls in flight: lone calls are timed alone",
                self.pipe.in_flight()
            );
        }
        let limit = DRAIN_LIMIT.as_nanos() as u64;
        let mut times = Vec::with_capacity(calls as usize);
        for _ in 0..calls {
            let start = self.watch.mark();
            self.pipe
                .submit(METHOD, &self.payload)
                .context("submitting a lone call")?;
            self.pipe.flush();
            while self.poll()? == 0 {
                if self.watch.elapsed_ns(start) > limit {
                    bail!("a lone call was not answered within {DRAIN_LIMIT:?}");
                }
            }
            times.push(self.watch.elapsed_ns(start) as f64);
        }
        Ok(median(&times))
    }

    /// Closed loop: keeps the window full for `warmup`, then counts the replies of the next
    /// `measure`, then drains. `stats`: a client of the server whose counters to snapshot
    /// at the window's edges.
    pub(super) fn closed_loop(
        &mut self,
        warmup: Duration,
        measure: Duration,
        stats: Option<&Client>,
    ) -> anyhow::Result<Counts> {
        let preempted = thread_preemptions();
        let origin = self.watch.mark();
        let warm_ns = warmup.as_nanos() as u64;
        let end_ns = warm_ns + measure.as_nanos() as u64;
        let mut start: Option<Snapshot> = None;
        let mut calls = 0u64;
        let end = loop {
            self.fill()?;
            let n = self.poll()? as u64;
            let now = self.watch.elapsed_ns(origin);
            match &start {
                Some(_) => {
                    calls += n;
                    if now >= end_ns {
                        break Snapshot::take(self, now, stats);
                    }
                }
                None if now >= warm_ns => start = Some(Snapshot::take(self, now, stats)),
                None => {}
            }
            if n == 0 && self.yield_when_idle {
                std::thread::yield_now();
            }
        };
        self.drain(origin, |_, _| {})?;
        let start = start.expect("the window started before it ended");
        Ok(Counts {
            preempted: thread_preemptions().saturating_sub(preempted),
            ..Counts::between(&start, &end, calls)
        })
    }

    /// Open loop: Poisson arrivals at `rate_per_s` from the origin; the calls scheduled in
    /// `[warmup, warmup + measure)` are measured, from their scheduled send time to their
    /// reply, so a late send (the window full, the generator behind) counts against the
    /// latency. Arrivals are sent in order as soon as they are due and the window has room;
    /// replies are polled continuously. Arrivals stop at the window's end, then the calls in
    /// flight are drained.
    pub(super) fn open_loop(
        &mut self,
        rate_per_s: f64,
        seed: u64,
        warmup: Duration,
        measure: Duration,
        stats: Option<&Client>,
    ) -> anyhow::Result<OpenWindow> {
        let mut arrivals = Arrivals::new(seed, rate_per_s);
        let mut latency = new_histogram();
        let mut send_lag = new_histogram();
        let warm_ns = warmup.as_nanos() as u64;
        let end_ns = warm_ns + measure.as_nanos() as u64;
        let (mut scheduled, mut unsent, mut calls) = (0u64, 0u64, 0u64);
        let mut start: Option<Snapshot> = None;
        let mut next = arrivals.gap_ns();
        let preempted = thread_preemptions();
        let origin = self.watch.mark();
        let end = loop {
            let now = self.watch.elapsed_ns(origin);
            if now >= end_ns {
                break Snapshot::take(self, now, stats);
            }
            if start.is_none() && now >= warm_ns {
                start = Some(Snapshot::take(self, now, stats));
            }
            // Every arrival due by now, oldest first, while the window has room.
            if (next as u64) <= now {
                let Driver {
                    pipe,
                    scheduled: times,
                    payload,
                    window,
                    ..
                } = self;
                while (next as u64) <= now && pipe.in_flight() < *window {
                    match pipe.submit(METHOD, &payload[..]) {
                        Ok(id) => {
                            let at = next as u64;
                            times[Pipeline::slot(id)] = at;
                            if at >= warm_ns {
                                scheduled += 1;
                                send_lag.saturating_record(now - at);
                            }
                            next += arrivals.gap_ns();
                        }
                        Err(e) if e.is_nack() => break,
                        Err(e) => return Err(e).context("submitting a pipelined call"),
                    }
                }
            }
            if self.poll()? > 0 {
                let now = self.watch.elapsed_ns(origin);
                for &(slot, _) in &self.delivered {
                    let at = self.scheduled[slot as usize];
                    if at >= warm_ns {
                        latency.saturating_record(now - at);
                    }
                    if now >= warm_ns && now < end_ns {
                        calls += 1;
                    }
                }
            }
        };
        // Arrivals of the window the client never got to send.
        while (next as u64) < end_ns {
            if next as u64 >= warm_ns {
                scheduled += 1;
                unsent += 1;
            }
            next += arrivals.gap_ns();
        }
        let times = std::mem::take(&mut self.scheduled);
        let drained = self.drain(origin, |slot, now| {
            let at = times[slot as usize];
            if at >= warm_ns {
                latency.saturating_record(now - at);
            }
        });
        self.scheduled = times;
        drained?;
        let start = start.context("the measured window never started")?;
        Ok(OpenWindow {
            counts: Counts {
                preempted: thread_preemptions().saturating_sub(preempted),
                ..Counts::between(&start, &end, calls)
            },
            latency,
            send_lag,
            scheduled,
            unsent,
        })
    }
}

/// Waits that spin: the client thread has a core of its own (or yields it explicitly).
pub(super) fn spin_policy() -> WaitPolicy {
    WaitPolicy {
        mode: WaitMode::Spin,
        spin: Duration::from_micros(50),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_gaps_have_the_right_mean() {
        let mut a = Arrivals::new(7, 1e6);
        let n = 200_000;
        let total: f64 = (0..n).map(|_| a.gap_ns()).sum();
        let mean = total / f64::from(n);
        assert!((mean - 1000.0).abs() < 20.0, "mean gap {mean} ns");
        assert!((0..1000).all(|_| a.gap_ns() > 0.0));
    }

    #[test]
    fn counts_merge_and_rate() {
        let mut c = Counts {
            calls: 1000,
            ns: 1_000_000,
            batches: 10,
            batched: 1000,
            ..Default::default()
        };
        assert!((c.rate() - 1e6).abs() < 1e-6);
        c.merge(&c.clone());
        assert_eq!((c.calls, c.ns, c.batches), (2000, 2_000_000, 20));
        assert_eq!(mean(c.batched, c.batches), 100.0);
        assert_eq!(mean(5, 0), 0.0);
    }
}
