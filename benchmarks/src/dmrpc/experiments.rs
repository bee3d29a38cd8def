//! The three closed experiments of `pass_by_reference` and what they share ([`Ctx`]): the
//! nested chain, copy-on-write against a copy, and the forwarding load balancer. Each
//! spawns its tiers, measures its variants in interleaved rounds (each round in the
//! opposite order of the last, so that a drift of the shared host hits them alike) and
//! returns its rows; printing and writing them is `render`'s and `report`'s job.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless::{CallOptions, Client, ClientConfig, Pipeline, WaitMode, WaitPolicy};
use netless_pool::Domain;

use super::client::{closed_loop, deltas, sequential_ops, snapshot, Payload, Window};
use super::data::{pattern, sum_buf, sum_words, Counts};
use super::report::Row;
use super::{
    client_config, wait_policy, Forward, Placement, COW_SIZES, DOMAIN, LB_SIZES, MAX_HOPS,
    TIER_BUFFER, WRITE_PERMILLE,
};
use crate::harness::histogram::new_histogram;
use crate::harness::noise::cpu_time;
use crate::harness::stats::{median_of_ratios, ratio};
use crate::harness::{cpu, Peer, Stop};

/// The order of the two variants in round `round`: alternating which goes first.
fn order(round: u32, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// What every experiment needs.
pub(super) struct Ctx {
    pub(super) dir: PathBuf,
    pub(super) domain: Domain,
    pub(super) spin_us: u64,
    pub(super) wait: WaitMode,
    /// (this process's CPU, the other one), unless not pinning.
    pub(super) cpus: Option<(usize, usize)>,
    pub(super) placement: Placement,
    pub(super) forward: Forward,
    pub(super) in_flight: usize,
    pub(super) batch: u32,
    pub(super) chain_sizes: Vec<usize>,
    pub(super) hops: Vec<u32>,
    pub(super) window: Duration,
    pub(super) warmup: Duration,
    /// Calls a warm-up makes at least, unless it takes longer than `warmup_cap`.
    pub(super) warmup_calls: u64,
    pub(super) warmup_cap: Duration,
    pub(super) rounds: u32,
    pub(super) bar: indicatif::ProgressBar,
}

impl Ctx {
    /// Spawns a tier serving `service`, forwarding to `next`, on this process's CPU
    /// (`same_cpu`) or the other one.
    fn spawn_tier(
        &self,
        service: &str,
        next: &[&str],
        same_cpu: bool,
        prefault: bool,
    ) -> anyhow::Result<Peer> {
        let dir = self.dir.to_str().context("socket directory is not UTF-8")?;
        let spin = self.spin_us.to_string();
        let wait = self.wait.to_string();
        let workers = self.in_flight.to_string();
        let forward = match self.forward {
            Forward::Pipelined => "pipelined",
            Forward::Async => "async",
            Forward::Blocking => "blocking",
        };
        let mut args = vec![
            "dmrpc-tier",
            "--service",
            service,
            "--dir",
            dir,
            "--domain",
            DOMAIN,
            "--spin-us",
            &spin,
            "--wait",
            &wait,
            "--forward",
            forward,
            "--workers",
            &workers,
        ];
        for n in next {
            args.extend(["--next", n]);
        }
        let cpus = self.cpus.map(|(mine, other)| match self.placement {
            Placement::Alternate if same_cpu => mine.to_string(),
            Placement::Alternate => other.to_string(),
            // Placed by `place` before each measurement.
            Placement::Reader => mine.to_string(),
            _ => format!("{mine},{other}"),
        });
        if let Some(cpus) = &cpus {
            args.extend(["--cpus", cpus]);
        }
        if prefault {
            args.push("--prefault");
        }
        let (peer, _) = Peer::spawn(&args, "LISTENING", Stop::CloseStdin)?;
        Ok(peer)
    }

    fn wait(&self) -> WaitPolicy {
        wait_policy(self.wait, self.spin_us)
    }

    /// With `Placement::Reader`, pins every thread of the `readers` processes to the second
    /// CPU and of the `forwarders` to the first (this process's); otherwise does nothing.
    fn place(&self, readers: &[u32], forwarders: &[u32]) -> anyhow::Result<()> {
        let (Placement::Reader, Some((mine, other))) = (self.placement, self.cpus) else {
            return Ok(());
        };
        for (pids, cpu) in [(readers, other), (forwarders, mine)] {
            for &pid in pids {
                cpu::pin_process(pid, cpu)
                    .with_context(|| format!("pinning process {pid} to CPU {cpu}"))?;
            }
        }
        Ok(())
    }

    /// Calls kept in flight with arrays of `size` bytes: `--in-flight`, or as many as fit a
    /// tier's receive buffer by value (so that large arrays are not mostly NACKed).
    pub(super) fn in_flight_for(&self, size: usize) -> usize {
        self.in_flight.min((TIER_BUFFER / size.max(1)).max(8))
    }

    /// Connects to a tier and sets its `batch` register.
    fn connect(&self, service: &str) -> anyhow::Result<Client> {
        let client = Client::connect_with(service, client_config(&self.dir, self.wait()))
            .with_context(|| format!("connecting to `{service}`"))?;
        let set = format!("batch={}", self.batch);
        client
            .call(netless::control::SET, set.as_bytes(), &CallOptions::new())
            .with_context(|| format!("`netless ctl {service} set {set}`"))?;
        Ok(client)
    }

    /// A pipeline to `service` deep enough for the calls kept in flight.
    fn pipeline(&self, service: &str) -> anyhow::Result<Pipeline> {
        let config = ClientConfig {
            max_in_flight: (self.in_flight as u32).max(1),
            ..client_config(&self.dir, self.wait())
        };
        Pipeline::connect(service, config).with_context(|| format!("connecting to `{service}`"))
    }

    /// Measures the two variants of one point of a closed-loop experiment, interleaved;
    /// `watch` is a process whose CPU time to measure too.
    fn closed_loop_point(
        &self,
        pipe: &mut Pipeline,
        peers: &[&Client],
        variants: [(&str, &Payload); 2],
        expect: u64,
        watch: Option<u32>,
        (readers, forwarders): (&[u32], &[u32]),
    ) -> anyhow::Result<[Acc; 2]> {
        let [a, b] = variants.map(|(method, payload)| Variant {
            method,
            payload,
            expect,
            peers: peers.to_vec(),
            in_flight: self.in_flight_for(payload.len()),
            readers: readers.to_vec(),
            forwarders: forwarders.to_vec(),
        });
        let mut acc = self.interleaved(pipe, &[a, b], watch)?.into_iter();
        Ok([
            acc.next().expect("two variants"),
            acc.next().expect("two variants"),
        ])
    }

    /// Measures `variants` in interleaved rounds (each round in the opposite order of the
    /// last), after warming each up, so that a drift of the shared host hits them alike and
    /// round-by-round ratios compare like with like.
    fn interleaved(
        &self,
        pipe: &mut Pipeline,
        variants: &[Variant<'_>],
        watch: Option<u32>,
    ) -> anyhow::Result<Vec<Acc>> {
        for v in variants {
            self.place(&v.readers, &v.forwarders)?;
            let started = Instant::now();
            let mut calls = 0;
            while calls < self.warmup_calls && started.elapsed() < self.warmup_cap {
                calls += closed_loop(
                    pipe,
                    v.method,
                    v.payload,
                    v.expect,
                    v.in_flight,
                    self.warmup,
                    &self.domain,
                )?
                .calls;
            }
            self.bar.inc(1);
        }
        let mut acc: Vec<Acc> = variants.iter().map(|_| Acc::new()).collect();
        for round in 0..self.rounds {
            for k in order(round, variants.len()) {
                let v = &variants[k];
                self.place(&v.readers, &v.forwarders)?;
                let before = snapshot(&self.domain, &v.peers)?;
                let cpu_before = watch.map(cpu_time);
                let w = closed_loop(
                    pipe,
                    v.method,
                    v.payload,
                    v.expect,
                    v.in_flight,
                    self.window,
                    &self.domain,
                )?;
                if let (Some(pid), Some(before)) = (watch, cpu_before) {
                    acc[k].cpu += cpu_time(pid).saturating_sub(before);
                }
                let after = snapshot(&self.domain, &v.peers)?;
                acc[k].add(&w, &deltas(&before, &after, &w));
                self.bar.inc(1);
            }
        }
        Ok(acc)
    }
}

/// One variant of an interleaved measurement: the call, what it should return, and the
/// processes whose counters it involves.
struct Variant<'a> {
    method: &'a str,
    payload: &'a Payload,
    expect: u64,
    peers: Vec<&'a Client>,
    in_flight: usize,
    /// With `Placement::Reader`: the processes that read the array, and the rest.
    readers: Vec<u32>,
    forwarders: Vec<u32>,
}

/// The two rows of an interleaved comparison, each with its throughput ratio over
/// `variants[base]` (from the totals and as the median of the rounds' ratios).
fn compared(
    acc: &[Acc; 2],
    experiment: &'static str,
    variants: [&'static str; 2],
    size: usize,
    in_flight: usize,
    base: usize,
) -> [Row; 2] {
    let mut pair = [0, 1].map(|k| acc[k].row(experiment, variants[k], size, in_flight));
    let base_throughput = pair[base].throughput_per_s;
    for (row, a) in pair.iter_mut().zip(acc) {
        row.ratio_vs_baseline = ratio(row.throughput_per_s, base_throughput);
        row.ratio_median_of_rounds = median_ratio(a, &acc[base]);
    }
    pair
}

/// The median of the round-by-round ratios of `acc` over `base`.
fn median_ratio(acc: &Acc, base: &Acc) -> Option<f64> {
    median_of_ratios(&acc.rounds, &base.rounds)
}

/// (a) The nested chain.
pub(super) fn nested_chain(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let names: Vec<String> = (1..=MAX_HOPS).map(|i| format!("tier{i}")).collect();
    // The last first, so that each tier finds its next one serving.
    let mut peers = Vec::new();
    for i in (0..names.len()).rev() {
        let next: Vec<&str> = names.get(i + 1).map(|s| s.as_str()).into_iter().collect();
        // tier1 on the other CPU than the client, tier2 on the client's, and so on.
        peers.push(ctx.spawn_tier(&names[i], &next, i % 2 == 1, false)?);
    }
    // Process ids in tier order (they were spawned last first).
    let pids: Vec<u32> = peers.iter().rev().map(Peer::id).collect();
    let tiers: Vec<Client> = names
        .iter()
        .map(|n| ctx.connect(n))
        .collect::<anyhow::Result<_>>()?;
    let mut pipe = ctx.pipeline(&names[0])?;
    let mut rows = Vec::new();
    for &size in &ctx.chain_sizes {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        // Written into the pool once; every call shares it afresh.
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        // Every hop count and both variants in each round: the 7-hop / 1-hop ratios compare
        // windows measured side by side, as the by-ref / by-value ratios do.
        let methods: Vec<[String; 2]> = ctx
            .hops
            .iter()
            .map(|h| [format!("value/{h}"), format!("ref/{h}")])
            .collect();
        let mut variants = Vec::new();
        for (&hops, [mv, mr]) in ctx.hops.iter().zip(&methods) {
            let involved: Vec<&Client> = tiers[..hops as usize].iter().collect();
            // The last tier of the chain reads the array; the others only forward.
            let reader = pids[hops as usize - 1];
            let forwarders: Vec<u32> = pids.iter().copied().filter(|&p| p != reader).collect();
            for (method, payload) in [(mv, &value), (mr, &pooled)] {
                variants.push(Variant {
                    method,
                    payload,
                    expect,
                    peers: involved.clone(),
                    in_flight: ctx.in_flight_for(size),
                    readers: vec![reader],
                    forwarders: forwarders.clone(),
                });
            }
        }
        let mut accs = ctx.interleaved(&mut pipe, &variants, None)?.into_iter();
        for &hops in &ctx.hops {
            let (Some(v), Some(r)) = (accs.next(), accs.next()) else {
                break;
            };
            let mut pair = compared(
                &[v, r],
                "nested_chain",
                ["by_value", "by_ref"],
                size,
                ctx.in_flight_for(size),
                0,
            );
            for row in &mut pair {
                row.hops = Some(hops);
            }
            rows.extend(pair);
        }
    }
    drop(tiers);
    drop(peers);
    Ok(rows)
}

/// (b) Copy-on-write against an unconditional copy.
pub(super) fn copy_on_write(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let callee = ctx.spawn_tier("callee", &[], false, true)?;
    ctx.place(&[callee.id()], &[])?;
    let client = ctx.connect("callee")?;
    let mut rows = Vec::new();
    for &size in &COW_SIZES {
        let data = pattern(size);
        let expect = sum_words(&data);
        let buf = ctx.domain.alloc_from(&data)?;
        for &permille in &WRITE_PERMILLE {
            let methods = [format!("cow/{permille}"), format!("copy/{permille}")];
            for m in &methods {
                let started = Instant::now();
                let mut calls = 0;
                while calls < ctx.warmup_calls && started.elapsed() < ctx.warmup_cap {
                    calls += sequential_ops(&client, m, &buf, &data, ctx.warmup)?.calls;
                }
                ctx.bar.inc(1);
            }
            let mut acc = [Acc::new(), Acc::new()];
            for round in 0..ctx.rounds {
                for k in order(round, 2) {
                    let before = snapshot(&ctx.domain, &[&client])?;
                    let w = sequential_ops(&client, &methods[k], &buf, &data, ctx.window)?;
                    let after = snapshot(&ctx.domain, &[&client])?;
                    acc[k].add(&w, &deltas(&before, &after, &w));
                    ctx.bar.inc(1);
                }
            }
            // Whatever the callee wrote, the client's buffer must not have changed.
            let intact = sum_buf(&buf) == expect;
            if !intact {
                bail!("the client's {size}-byte buffer changed under copy-on-write");
            }
            let mut pair = compared(&acc, "cow", ["cow", "copy"], size, 1, 1);
            for (row, a) in pair.iter_mut().zip(&acc) {
                let n = a.calls.max(1) as f64;
                let us = |ns: u64| ns as f64 / n / 1000.0;
                row.write_fraction = Some(permille as f64 / 1000.0);
                row.share_us = Some(us(a.share_ns));
                row.map_us = Some(us(a.map_ns));
                row.copy_us = Some(us(a.copy_ns));
                row.write_us = Some(us(a.write_ns));
                row.unmap_us = Some(us(a.unmap_ns));
                row.create_ref_us = Some(us(a.share_ns + a.map_ns + a.copy_ns));
                row.verified &= intact;
            }
            rows.extend(pair);
        }
    }
    drop(client);
    drop(callee);
    Ok(rows)
}

/// (c) The forwarding load balancer.
pub(super) fn load_balancer(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    // The forwarder gets the other CPU to itself; the workers share the client's.
    let w0 = ctx.spawn_tier("w0", &[], true, false)?;
    let w1 = ctx.spawn_tier("w1", &[], true, false)?;
    let lb = ctx.spawn_tier("lb", &["w0", "w1"], false, false)?;
    let clients = [ctx.connect("lb")?, ctx.connect("w0")?, ctx.connect("w1")?];
    let peers: Vec<&Client> = clients.iter().collect();
    let mut pipe = ctx.pipeline("lb")?;
    let mut rows = Vec::new();
    for &size in &LB_SIZES {
        let data = Arc::new(pattern(size));
        let expect = sum_words(&data);
        let value = Payload::Value(data.clone());
        let pooled = Payload::Ref(Arc::new(ctx.domain.alloc_from(&data)?));
        let acc = ctx.closed_loop_point(
            &mut pipe,
            &peers,
            [("value/2", &value), ("ref/2", &pooled)],
            expect,
            Some(lb.id()),
            (&[w0.id(), w1.id()], &[lb.id()]),
        )?;
        let mut pair = compared(
            &acc,
            "load_balancer",
            ["by_value", "by_ref"],
            size,
            ctx.in_flight_for(size),
            0,
        );
        for (row, a) in pair.iter_mut().zip(&acc) {
            // procs[1] is the forwarder.
            let f = a.procs.get(1).copied().unwrap_or_default();
            let n = a.calls.max(1) as f64;
            row.hops = Some(2);
            row.forwarder_bytes_copied_per_call = Some((f.payload_bytes + f.pool_bytes) as f64 / n);
            row.forwarder_payload_bytes_copied_per_call = Some(f.payload_bytes as f64 / n);
            row.forwarder_pool_bytes_copied_per_call = Some(f.pool_bytes as f64 / n);
            row.forwarder_handle_bytes_per_call = Some(f.handle_bytes as f64 / n);
            row.forwarder_cpu_us_per_call = Some(a.cpu.as_secs_f64() * 1e6 / n);
        }
        rows.extend(pair);
    }
    drop(clients);
    drop((lb, w0, w1));
    Ok(rows)
}

/// Figures gathered over the windows of one (point, variant).
struct Acc {
    calls: u64,
    elapsed: Duration,
    hist: Histogram<u64>,
    retries: u64,
    /// Deltas per process: index 0 is this process, then the peers involved.
    procs: Vec<Counts>,
    share_ns: u64,
    map_ns: u64,
    copy_ns: u64,
    write_ns: u64,
    unmap_ns: u64,
    /// Throughput of each round.
    rounds: Vec<f64>,
    /// CPU time of the watched process (the forwarder) over the windows.
    cpu: Duration,
}

impl Acc {
    fn new() -> Acc {
        Acc {
            calls: 0,
            elapsed: Duration::ZERO,
            hist: new_histogram(),
            retries: 0,
            procs: Vec::new(),
            share_ns: 0,
            map_ns: 0,
            copy_ns: 0,
            write_ns: 0,
            unmap_ns: 0,
            rounds: Vec::new(),
            cpu: Duration::ZERO,
        }
    }

    fn add(&mut self, w: &Window, deltas: &[Counts]) {
        self.rounds
            .push(w.calls as f64 / w.elapsed.as_secs_f64().max(1e-9));
        self.calls += w.calls;
        self.elapsed += w.elapsed;
        self.hist.add(&w.hist).ok();
        self.retries += w.retries;
        self.share_ns += w.share_ns;
        self.map_ns += w.map_ns;
        self.copy_ns += w.copy_ns;
        self.write_ns += w.write_ns;
        self.unmap_ns += w.unmap_ns;
        if self.procs.is_empty() {
            self.procs = vec![Counts::default(); deltas.len()];
        }
        for (p, d) in self.procs.iter_mut().zip(deltas) {
            *p = p.zip(*d, u64::wrapping_add);
        }
    }

    fn row(
        &self,
        experiment: &'static str,
        variant: &'static str,
        size_bytes: usize,
        in_flight: usize,
    ) -> Row {
        let n = self.calls.max(1) as f64;
        let total = self
            .procs
            .iter()
            .fold(Counts::default(), |a, b| a.zip(*b, u64::wrapping_add));
        let per = |x: u64| x as f64 / n;
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        Row {
            experiment,
            variant,
            size_bytes,
            hops: None,
            write_fraction: None,
            in_flight,
            calls: self.calls,
            throughput_per_s: self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9),
            avg_latency_us: self.hist.mean() / 1000.0,
            p50_us: q(0.5),
            p99_us: q(0.99),
            bytes_copied_per_call: per(total.payload_bytes + total.pool_bytes),
            payload_bytes_copied_per_call: per(total.payload_bytes),
            pool_bytes_copied_per_call: per(total.pool_bytes),
            pages_copied_per_call: per(total.pool_pages),
            handle_bytes_per_call: per(total.handle_bytes),
            maps_per_call: per(total.maps),
            forwarder_bytes_copied_per_call: None,
            forwarder_payload_bytes_copied_per_call: None,
            forwarder_pool_bytes_copied_per_call: None,
            forwarder_handle_bytes_per_call: None,
            forwarder_cpu_us_per_call: None,
            create_ref_us: None,
            share_us: None,
            map_us: None,
            copy_us: None,
            write_us: None,
            unmap_us: None,
            ratio_vs_baseline: None,
            ratio_median_of_rounds: None,
            round_throughputs_per_s: self.rounds.clone(),
            verified: self.calls > 0,
            retries: self.retries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_order() {
        assert_eq!(order(0, 2), [0, 1]);
        assert_eq!(order(1, 2), [1, 0]);
        assert_eq!(order(3, 3), [2, 1, 0]);
    }
}
