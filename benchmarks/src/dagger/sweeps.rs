//! The measurements of `batching`, each over interleaved rounds of its settings: one
//! client thread's closed loop by batching setting (Fig. 5), with and without a stats
//! reader, two client threads' closed loops, and the open-loop latency sweep (Fig. 6). It
//! owns how the settings take turns and what each window records besides its figures
//! (preemptions, steal: [`Mark`]); the rows' meaning is `rows`' and `acceptance`'s.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{Client, ClientConfig};

use super::acceptance::best_row;
use super::load::{mean, Counts, Driver};
use super::rows::{LatencyRow, StatsReader, ThroughputRow};
use super::server::PairsDispatch;
use super::{
    rounds_at, Setting, BEYOND_PEAK, LATENCY_SETTINGS, LONE_CALLS, READER_PERIOD, SERVICE,
    THROUGHPUT_SETTINGS,
};
use crate::harness::clock::Stopwatch;
use crate::harness::histogram::{mean_us, quantile_us};
use crate::harness::noise::{process_preemptions, steal_ms};
use crate::harness::stats::{median, median_or, paired_ratios};
use crate::harness::{Peer, Stop};

/// What every experiment needs.
pub(super) struct Ctx {
    pub(super) dir: PathBuf,
    pub(super) watch: Stopwatch,
    pub(super) in_flight: u32,
    pub(super) warmup: Duration,
    pub(super) window: Duration,
    pub(super) rounds: u32,
    pub(super) latency_rounds: u32,
    pub(super) low_load_rounds: u32,
    pub(super) loads: Vec<f64>,
    /// (the client's CPU, the server worker's CPU), unless not pinning.
    pub(super) cpus: Option<(usize, usize)>,
    pub(super) pair_spin_us: u64,
    pub(super) pairs_dispatch: PairsDispatch,
    pub(super) bar: indicatif::ProgressBar,
}

impl Ctx {
    /// See [`rounds_at`].
    pub(super) fn rounds_at(&self, fraction: f64) -> u32 {
        rounds_at(fraction, self.latency_rounds, self.low_load_rounds)
    }

    /// Spawns the echo server of `service` with `workers` workers pinned to `cpus` in turn,
    /// spinning (`spin_us` None) or sleeping after `spin_us`, dispatching by `dispatch`.
    pub(super) fn spawn_server(
        &self,
        service: &str,
        workers: usize,
        cpus: &[usize],
        spin_us: Option<u64>,
        dispatch: PairsDispatch,
    ) -> anyhow::Result<Peer> {
        let dir = self.dir.to_str().context("socket directory is not UTF-8")?;
        let workers = workers.to_string();
        let cpus = cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let spin = spin_us.map(|us| us.to_string());
        let dispatch = dispatch.name();
        let mut args = vec![
            "echo-server",
            "--dir",
            dir,
            "--service",
            service,
            "--workers",
            &workers,
            "--dispatch",
            &dispatch,
        ];
        if !cpus.is_empty() {
            args.extend(["--pin-cpus", &cpus]);
        }
        if let Some(spin) = &spin {
            args.extend(["--spin-us", spin]);
        }
        let (peer, _) = Peer::spawn(&args, "LISTENING", Stop::CloseStdin)?;
        Ok(peer)
    }

    /// A plain client of `service` to set its registers and read its counters.
    pub(super) fn control(&self, service: &str) -> anyhow::Result<Client> {
        let config = ClientConfig {
            dir: Some(self.dir.clone()),
            default_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        Client::connect_with(service, config).with_context(|| format!("connecting to `{service}`"))
    }

    /// A client thread's pipeline, its calls to come from `cpu` (when known).
    pub(super) fn driver(
        &self,
        service: &str,
        yield_when_idle: bool,
        cpu: Option<usize>,
    ) -> anyhow::Result<Driver> {
        Driver::connect(
            service,
            &self.dir,
            (self.in_flight, cpu),
            self.watch,
            yield_when_idle,
        )
    }

    /// Faults in both ends' rings and buffers before anything is measured.
    pub(super) fn warm_up(&self, ctl: &Client, drivers: &mut [Driver]) -> anyhow::Result<()> {
        Setting::Fixed(16).apply(ctl)?;
        for d in drivers {
            d.closed_loop(self.warmup * 2, self.warmup, None)?;
        }
        Ok(())
    }
}

/// `0..n` rotated left by `round`: each round runs the settings in another order, so a drift
/// of the shared host does not always hit the same one.
fn order(round: u32, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + round as usize) % n)
}

/// The server's preemptions and the machine's steal time at one instant.
#[derive(Clone, Copy, Debug)]
struct Mark {
    server: u64,
    steal_ms: f64,
}

impl Mark {
    /// Reads them now; `server` is the server process's id.
    fn now(server: u32) -> Mark {
        Mark {
            server: process_preemptions(server, ""),
            steal_ms: steal_ms(None),
        }
    }

    /// (server preemptions, steal ms) since `self`.
    fn since(self, server: u32) -> (u64, f64) {
        let now = Mark::now(server);
        (
            now.server.saturating_sub(self.server),
            (now.steal_ms - self.steal_ms).max(0.0),
        )
    }
}

/// One setting's rounds of a throughput sweep.
#[derive(Default)]
pub(super) struct Rounds {
    pub(super) rates: Vec<f64>,
    /// Per round: the median lone call just before its window, µs (single client only).
    pub(super) lone_us: Vec<f64>,
    pub(super) counts: Counts,
    pub(super) server_preempted: u64,
    pub(super) steal_ms: f64,
}

impl Rounds {
    fn add_noise(&mut self, (server_preempted, steal_ms): (u64, f64)) {
        self.server_preempted += server_preempted;
        self.steal_ms += steal_ms;
    }
}

pub(super) fn throughput_rows(
    experiment: &'static str,
    threads: usize,
    per: &[Rounds],
) -> Vec<ThroughputRow> {
    let b1 = THROUGHPUT_SETTINGS
        .iter()
        .position(|s| *s == Setting::Fixed(1))
        .map(|i| median(&per[i].rates));
    THROUGHPUT_SETTINGS
        .iter()
        .zip(per)
        .map(|(s, r)| {
            let m = median(&r.rates);
            ThroughputRow {
                experiment,
                setting: s.label(),
                batch_mode: s.mode(),
                batch: s.batch(),
                client_threads: threads,
                server_workers: threads,
                median_mrps: m / 1e6,
                min_mrps: r.rates.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                max_mrps: r.rates.iter().copied().fold(0.0, f64::max) / 1e6,
                round_mrps: r.rates.iter().map(|x| x / 1e6).collect(),
                lone_call_us: (!r.lone_us.is_empty()).then(|| median(&r.lone_us)),
                round_lone_call_us: r.lone_us.clone(),
                calls: r.counts.calls,
                client_mean_batch: mean(r.counts.batched, r.counts.batches),
                server_mean_batch: mean(r.counts.server_calls, r.counts.server_entries),
                vs_b1: b1.filter(|b| *b > 0.0).map_or(0.0, |b| m / b),
                client_preemptions: r.counts.preempted,
                server_preemptions: r.server_preempted,
                steal_ms: r.steal_ms,
            }
        })
        .collect()
}

/// Fig. 5: one client thread, one worker, closed loop, the settings interleaved.
pub(super) fn throughput_single(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    driver: &mut Driver,
) -> anyhow::Result<Vec<ThroughputRow>> {
    let mut per: Vec<Rounds> = THROUGHPUT_SETTINGS
        .iter()
        .map(|_| Rounds::default())
        .collect();
    for round in 0..ctx.rounds {
        for k in order(round, THROUGHPUT_SETTINGS.len()) {
            // The pace under one setting for every window: a fixed batch's lone call would
            // also take (and prefetch) a whole batch's run.
            Setting::Fixed(1).apply(ctl)?;
            let lone = driver.lone_call_ns(LONE_CALLS)?;
            per[k].lone_us.push(lone / 1e3);
            THROUGHPUT_SETTINGS[k].apply(ctl)?;
            let mark = Mark::now(server);
            let c = driver.closed_loop(ctx.warmup, ctx.window, Some(ctl))?;
            per[k].add_noise(mark.since(server));
            per[k].rates.push(c.rate());
            per[k].counts.merge(&c);
            ctx.bar.inc(1);
        }
    }
    Ok(throughput_rows("single", 1, &per))
}

/// Reading stats while the data path runs: the best fixed setting's closed loop with a
/// thread reading the replica's stats every [`READER_PERIOD`] (from shared memory, as
/// `netless stat` does), with a thread waking as often and reading nothing (on two CPUs a
/// third thread takes one from the client or the worker at each wake-up), and with
/// neither, interleaved round by round.
pub(super) fn stats_reader(
    ctx: &Ctx,
    ctl: &Client,
    driver: &mut Driver,
    single: &[ThroughputRow],
) -> anyhow::Result<StatsReader> {
    let best = best_row(single, true)
        .and_then(|row| {
            THROUGHPUT_SETTINGS
                .into_iter()
                .find(|s| s.label() == row.setting)
        })
        .context("no fixed setting was measured")?;
    best.apply(ctl)?;
    let reader = ctx.control(SERVICE)?;
    let (mut with, mut waker, mut without) = (Vec::new(), Vec::new(), Vec::new());
    let mut reads = 0u64;
    for round in 0..ctx.rounds {
        // 0: no other thread, 1: the reader, 2: the idle waker.
        for k in order(round, 3) {
            let reading = k == 1;
            let stop = AtomicBool::new(false);
            let c = std::thread::scope(|s| {
                let handle = (k > 0).then(|| {
                    s.spawn(|| {
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            if reading {
                                std::hint::black_box(reader.replica_stats());
                                n += 1;
                            }
                            std::thread::sleep(READER_PERIOD);
                        }
                        n
                    })
                });
                let c = driver.closed_loop(ctx.warmup, ctx.window, Some(ctl));
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = handle {
                    reads += h.join().expect("the stats reader does not panic");
                }
                c
            })?;
            [&mut without, &mut with, &mut waker][k].push(c.rate() / 1e6);
            ctx.bar.inc(1);
        }
    }
    let round_ratios = paired_ratios(&with, &without);
    let waker_round_ratios = paired_ratios(&with, &waker);
    Ok(StatsReader {
        setting: best.label(),
        period_us: READER_PERIOD.as_micros() as u64,
        reads,
        without_mrps: median(&without),
        with_mrps: median(&with),
        waker_mrps: median(&waker),
        with_over_without: median_or(&round_ratios, 0.0),
        round_ratios,
        with_over_waker: median_or(&waker_round_ratios, 0.0),
        waker_round_ratios,
    })
}

/// The same sweep with two client threads, each with its own pipeline, and two workers;
/// client thread i runs on CPU i (when pinning), as does worker i.
pub(super) fn throughput_pairs(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    drivers: &mut [Driver],
) -> anyhow::Result<Vec<ThroughputRow>> {
    let cpus: Vec<Option<usize>> = match ctx.cpus {
        Some((a, b)) => vec![Some(a), Some(b)],
        None => vec![None, None],
    };
    let mut per: Vec<Rounds> = THROUGHPUT_SETTINGS
        .iter()
        .map(|_| Rounds::default())
        .collect();
    for round in 0..ctx.rounds {
        for k in order(round, THROUGHPUT_SETTINGS.len()) {
            THROUGHPUT_SETTINGS[k].apply(ctl)?;
            let mark = Mark::now(server);
            let results: Vec<anyhow::Result<Counts>> = std::thread::scope(|s| {
                let handles: Vec<_> = drivers
                    .iter_mut()
                    .zip(&cpus)
                    .enumerate()
                    .map(|(i, (d, cpu))| {
                        let stats = (i == 0).then_some(ctl);
                        let (warmup, window) = (ctx.warmup, ctx.window);
                        s.spawn(move || {
                            if let Some(cpu) = *cpu {
                                netless_shm::pin_current_thread(cpu)?;
                            }
                            d.closed_loop(warmup, window, stats)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| bail!("a client thread panicked"))
                    })
                    .collect()
            });
            let mut rate = 0.0;
            for c in results {
                let c = c?;
                rate += c.rate();
                per[k].counts.merge(&c);
            }
            per[k].rates.push(rate);
            per[k].add_noise(mark.since(server));
            ctx.bar.inc(1);
        }
    }
    Ok(throughput_rows("pairs", drivers.len(), &per))
}

/// One setting's windows at one load of the latency sweep.
pub(super) struct LatencyAcc {
    pub(super) counts: Counts,
    pub(super) latency: Histogram<u64>,
    pub(super) send_lag: Histogram<u64>,
    pub(super) scheduled: u64,
    pub(super) unsent: u64,
    pub(super) server_preempted: u64,
    pub(super) steal_ms: f64,
    pub(super) round_p50_us: Vec<f64>,
    pub(super) round_p99_us: Vec<f64>,
}

/// Fig. 6 (left): open loop at each load for each latency setting, interleaved.
pub(super) fn latency_sweep(
    ctx: &Ctx,
    (ctl, server): (&Client, u32),
    driver: &mut Driver,
    single: &[ThroughputRow],
    peak: f64,
) -> anyhow::Result<Vec<LatencyRow>> {
    let own_peak = |s: Setting| {
        single
            .iter()
            .find(|r| r.setting == s.label())
            .map_or(0.0, |r| r.median_mrps * 1e6)
    };
    let mut rows = Vec::new();
    for (p, &fraction) in ctx.loads.iter().enumerate() {
        let rate = fraction * peak;
        let mut acc: Vec<Option<LatencyAcc>> = LATENCY_SETTINGS.iter().map(|_| None).collect();
        for round in 0..ctx.rounds_at(fraction) {
            for k in order(round + p as u32, LATENCY_SETTINGS.len()) {
                let setting = LATENCY_SETTINGS[k];
                ctx.bar.inc(1);
                // The lowest load is always run: it is the low-load latency every setting is
                // compared at, and a noisy peak must not drop it.
                if p > 0 && rate > BEYOND_PEAK * own_peak(setting) {
                    continue;
                }
                setting.apply(ctl)?;
                let seed = 0x5eed_0000 ^ ((p as u64) << 16) ^ (u64::from(round) << 8) ^ k as u64;
                let mark = Mark::now(server);
                let w = driver.open_loop(rate, seed, ctx.warmup, ctx.window, Some(ctl))?;
                let (server_preempted, steal_ms) = mark.since(server);
                let (p50, p99) = (quantile_us(&w.latency, 0.5), quantile_us(&w.latency, 0.99));
                match &mut acc[k] {
                    Some(a) => {
                        a.round_p50_us.push(p50);
                        a.round_p99_us.push(p99);
                        a.server_preempted += server_preempted;
                        a.steal_ms += steal_ms;
                        a.counts.merge(&w.counts);
                        a.latency.add(&w.latency)?;
                        a.send_lag.add(&w.send_lag)?;
                        a.scheduled += w.scheduled;
                        a.unsent += w.unsent;
                    }
                    slot => {
                        *slot = Some(LatencyAcc {
                            counts: w.counts,
                            latency: w.latency,
                            send_lag: w.send_lag,
                            scheduled: w.scheduled,
                            unsent: w.unsent,
                            server_preempted,
                            steal_ms,
                            round_p50_us: vec![p50],
                            round_p99_us: vec![p99],
                        })
                    }
                }
            }
        }
        for (setting, a) in LATENCY_SETTINGS.iter().zip(acc) {
            let Some(a) = a else { continue };
            let achieved = a.counts.rate();
            rows.push(LatencyRow {
                setting: setting.label(),
                batch_mode: setting.mode(),
                batch: setting.batch(),
                load_fraction: fraction,
                offered_mrps: rate / 1e6,
                achieved_mrps: achieved / 1e6,
                calls: a.latency.len(),
                mean_us: mean_us(&a.latency),
                p50_us: quantile_us(&a.latency, 0.5),
                p99_us: quantile_us(&a.latency, 0.99),
                p999_us: quantile_us(&a.latency, 0.999),
                round_p50_us: a.round_p50_us,
                round_p99_us: a.round_p99_us,
                send_lag_p99_us: quantile_us(&a.send_lag, 0.99),
                scheduled: a.scheduled,
                unsent: a.unsent,
                saturated: a.unsent * 1000 > a.scheduled || achieved < 0.9 * rate,
                client_mean_batch: mean(a.counts.batched, a.counts.batches),
                server_mean_batch: mean(a.counts.server_calls, a.counts.server_entries),
                client_preemptions: a.counts.preempted,
                server_preemptions: a.server_preempted,
                steal_ms: a.steal_ms,
            });
        }
    }
    Ok(rows)
}
