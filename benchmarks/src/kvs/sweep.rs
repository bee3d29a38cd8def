//! How `slo_buffers` runs its configurations: the server and generator peers of each
//! ([`Ctx`]), what is measured before the sweep ([`baseline`]) and the sweeps themselves
//! ([`sweep`]), each load point's window with the server's and the generator's figures for
//! the same calls. It never prints: the rows go to `render`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::config::{
    serde_plain, Buffer, Config, Dispatch, Provisioning, CONNECTIONS, MEAN_REQUEST, SLO_RATIO,
};
use super::load::{Window, ZeroLoad};
use super::rows::{Baseline, LoadPoint, Measurement, Noise, Row};
use super::store::{Calibration, ServerWindow, Stats};
use crate::harness::noise::{main_thread_preemptions, process_preemptions, steal_ms};
use crate::harness::peer::ANSWER_TIMEOUT;
use crate::harness::{Peer, Stop};

/// How long a lone worker spins for requests before it sleeps, µs.
const WORKER_SPIN_US: u64 = 10_000;

/// Where the peers run and what they all need.
pub(super) struct Ctx {
    /// The run's socket directory.
    pub dir: String,
    /// Keys in the store.
    pub keys: u32,
    /// Computation added to each request, ns.
    pub work_ns: u64,
    /// (generator CPU, server CPU), unless the machine has one CPU.
    pub cpus: Option<(usize, usize)>,
}

impl Ctx {
    /// Starts the key-value server of `config` as `service`, with the SLO (server-side p99,
    /// mean service time; µs) if the configuration has one.
    pub(super) fn server(
        &self,
        service: &str,
        config: &Config,
        slo: Option<(f64, f64)>,
    ) -> anyhow::Result<Peer> {
        let mut args: Vec<String> = ["server", "--dir", &self.dir, "--service", service]
            .map(String::from)
            .to_vec();
        let provisioning = serde_plain(&config.provisioning);
        let dispatch = serde_plain(&config.dispatch);
        args.extend([
            "--keys".into(),
            self.keys.to_string(),
            "--provisioning".into(),
            provisioning,
            "--dispatch".into(),
            dispatch,
            "--workers".into(),
            config.workers.to_string(),
            "--work-ns".into(),
            self.work_ns.to_string(),
            "--request-bytes".into(),
            MEAN_REQUEST.to_string(),
            "--max-connections".into(),
            (CONNECTIONS[2] + 64).to_string(),
        ]);
        if let Some(b) = config.buffer_bytes() {
            args.extend(["--buffer-bytes".into(), b.to_string()]);
        }
        if let (true, Some((slo_us, service_us))) = (config.slo, slo) {
            args.extend([
                "--slo-ns".into(),
                ((slo_us * 1e3) as u64).to_string(),
                "--service-ns".into(),
                ((service_us * 1e3) as u64).max(1).to_string(),
            ]);
        }
        // One worker spins up to 10 ms before it sleeps, so that the server's CPU does not
        // idle between requests at low load (an idle vCPU of this VM can take milliseconds to
        // get back from the hypervisor); workers that share a core sleep as soon as idle (see
        // the module docs).
        let spin_us = if config.workers > 1 {
            0
        } else {
            WORKER_SPIN_US
        };
        args.extend(["--spin-us".into(), spin_us.to_string()]);
        if let Some((helpers, workers)) = self.cpus {
            args.extend([
                "--pin-cpu".into(),
                workers.to_string(),
                "--helper-cpu".into(),
                helpers.to_string(),
            ]);
        }
        let (server, _) = Peer::spawn(&args, "LISTENING", Stop::CloseStdin)?;
        Ok(server)
    }

    /// Starts a load generator with `connections` connections to `service`.
    pub(super) fn generator(&self, service: &str, connections: usize) -> anyhow::Result<Peer> {
        let mut args: Vec<String> = ["load", "--dir", &self.dir, "--service", service]
            .map(String::from)
            .to_vec();
        args.extend([
            "--keys".into(),
            self.keys.to_string(),
            "--connections".into(),
            connections.to_string(),
        ]);
        if let Some((cpu, _)) = self.cpus {
            args.extend(["--pin-cpu".into(), cpu.to_string()]);
        }
        let (generator, _) = Peer::spawn(&args, "READY", Stop::CloseStdin)?;
        Ok(generator)
    }
}

/// The figures of one window: the generator's, then the server's for the same calls.
fn measure_point(
    ctx: &Ctx,
    server: &mut Peer,
    generator: &mut Peer,
    rate: f64,
    warmup: Duration,
    window: Duration,
    seed: u64,
) -> anyhow::Result<Measurement> {
    let before: Stats = server.ask("stats")?;
    let server_cpu = Some(ctx.cpus.map_or(0, |(_, s)| s));
    // The server's workers, and the generator's one thread that sends and polls (its main
    // thread; the connections' monitor threads only sleep).
    let workers = |s: &Peer| process_preemptions(s.id(), "netless-worker");
    let sender = |g: &Peer| main_thread_preemptions(g.id());
    let (s0, g0, t0) = (workers(server), sender(generator), steal_ms(server_cpu));
    let w: Window = generator.ask(&format!(
        "run {rate} {} {} {seed}",
        warmup.as_millis(),
        window.as_millis()
    ))?;
    let noise = Noise {
        server_preemptions: workers(server).saturating_sub(s0),
        generator_preemptions: sender(generator).saturating_sub(g0),
        server_cpu_steal_ms: (steal_ms(server_cpu) - t0).max(0.0),
    };
    // The server-side latency at the rank of the 99th percentile among all calls sent.
    let q = if w.accepted > 0 {
        (0.99 * w.sent as f64 / w.accepted as f64).min(1.0)
    } else {
        1.0
    };
    let sw: ServerWindow = server.ask(&format!("window {q}"))?;
    let mut after: Stats = server.ask("stats")?;
    after.requests -= before.requests;
    Ok(Measurement {
        client: w,
        server: sw,
        stats: after,
        noise,
    })
}

/// Measures the service time, the SLO and the capacity on the reference server.
pub(super) fn baseline(ctx: &Ctx, quick: bool, work_us: f64) -> anyhow::Result<Baseline> {
    let reference = Config::new(
        "reference",
        Provisioning::Shared,
        Dispatch::Single,
        1,
        CONNECTIONS[0],
        Buffer::Default,
    );
    let mut server = ctx.server("kv.ref", &reference, None)?;
    let handler: Calibration = server.ask(if quick {
        "calibrate 20000"
    } else {
        "calibrate 200000"
    })?;
    let mut generator = ctx.generator("kv.ref", reference.connections)?;
    // Warm the paths (and the store's pages), then measure one call at a time, three
    // times: the machine is shared, and a stall of a few ms moves a mean of µs, so the
    // quietest of the three is kept.
    let _: ZeroLoad = generator.ask("zero 500 7")?;
    let _: ServerWindow = server.ask("window 0.99")?;
    let calls = if quick { 1000 } else { 2000 };
    let mut zero: Option<(ZeroLoad, ServerWindow)> = None;
    for round in 0..3 {
        let client: ZeroLoad = generator.ask(&format!("zero {calls} {round}"))?;
        let at_server: ServerWindow = server.ask("window 0.99")?;
        if client.failed > 0 || at_server.latency.count == 0 {
            bail!("zero-load calls failed: {client:?}");
        }
        if zero
            .as_ref()
            .is_none_or(|(_, z)| at_server.latency.mean_us < z.latency.mean_us)
        {
            zero = Some((client, at_server));
        }
    }
    let (client, zero) = zero.expect("three rounds");
    // Far more than the server can take: its queue stays full, it never idles. The best of
    // two windows.
    let rate = (4e6 / zero.latency.mean_us).min(3e6);
    let window = Duration::from_millis(if quick { 150 } else { 400 });
    let mut capacity = (0.0f64, 0.0f64);
    for round in 0..2 {
        let w = measure_point(
            ctx,
            &mut server,
            &mut generator,
            rate,
            window / 3,
            window,
            11 + round,
        )?
        .client;
        let accepted = w.accepted as f64 / w.window_s;
        if accepted > capacity.0 {
            capacity = (accepted, w.sent as f64 / w.window_s);
        }
    }
    Ok(Baseline {
        keys: ctx.keys,
        work_us,
        handler,
        zero_load_server: zero.latency,
        zero_load_client: client.latency,
        slo_us: SLO_RATIO * zero.latency.mean_us,
        capacity_per_s: capacity.0,
        capacity_offered_per_s: capacity.1,
    })
}

/// A configuration's server and generator, started and warmed for a sweep.
struct Running<'c> {
    config: &'c Config,
    server: Peer,
    generator: Peer,
    open: Stats,
    rows: Vec<Row>,
}

impl<'c> Running<'c> {
    fn start(ctx: &Ctx, base: &Baseline, config: &'c Config) -> anyhow::Result<Running<'c>> {
        let service = format!("kv.{}", ctx_service_suffix(config));
        let mut server = ctx.server(
            &service,
            config,
            Some((base.slo_us, base.zero_load_server.mean_us)),
        )?;
        let mut generator = ctx.generator(&service, config.connections)?;
        // The server counts a connection once its acceptor has registered it, a moment after
        // the client's handshake.
        let mut open: Stats = server.ask("stats")?;
        let since = Instant::now();
        while (open.connections as usize) < config.connections
            && since.elapsed() < ANSWER_TIMEOUT / 10
        {
            std::thread::sleep(Duration::from_millis(20));
            open = server.ask("stats")?;
        }
        if open.connections as usize != config.connections {
            bail!(
                "{} connections open instead of {}",
                open.connections,
                config.connections
            );
        }
        // Use every connection once, then warm the store.
        let warm: ZeroLoad = generator.ask("warm")?;
        if warm.failed > 0 {
            bail!("{} of the warm-up calls failed", warm.failed);
        }
        let _: ZeroLoad = generator.ask("zero 300 5")?;
        let _: ServerWindow = server.ask("window 0.99")?;
        Ok(Running {
            config,
            server,
            generator,
            open,
            rows: Vec::new(),
        })
    }
}

/// Sweeps `configs` together: at each load point, each configuration in turn (the order
/// alternating from point to point), so that a drift of the shared host hits the
/// configurations compared alike. Returns each configuration's rows.
pub(super) fn sweep(
    ctx: &Ctx,
    base: &Baseline,
    configs: &[&Config],
    fractions: &[f64],
    (window, repeats): (Duration, u32),
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Vec<Row>>> {
    let names: Vec<&str> = configs.iter().map(|c| c.mode.as_str()).collect();
    bar.set_message(format!("{} × {}", names.join(", "), configs[0].connections));
    let mut running = Vec::new();
    for config in configs {
        running.push(
            Running::start(ctx, base, config).with_context(|| {
                format!("{} with {} connections", config.mode, config.connections)
            })?,
        );
    }
    let warmup = (window / 4).max(Duration::from_millis(30));
    for (k, &fraction) in fractions.iter().enumerate() {
        let planned = fraction * base.capacity_per_s;
        let order: Vec<usize> = if k % 2 == 0 {
            (0..running.len()).collect()
        } else {
            (0..running.len()).rev().collect()
        };
        for i in order {
            let r = &mut running[i];
            let mut kept: Option<Row> = None;
            for attempt in 0..repeats {
                let m = measure_point(
                    ctx,
                    &mut r.server,
                    &mut r.generator,
                    planned,
                    warmup,
                    window,
                    (k as u64 + 1) * 100 + u64::from(attempt),
                )
                .with_context(|| {
                    format!(
                        "{} with {} connections",
                        r.config.mode, r.config.connections
                    )
                })?;
                let point = LoadPoint {
                    fraction,
                    planned_per_s: planned,
                };
                let row = Row::new(r.config, &r.open, base, point, m);
                let better = kept.as_ref().is_none_or(|old| row.rank() < old.rank());
                let met = row.within_slo;
                if better {
                    kept = Some(Row {
                        window_kept: attempt + 1,
                        ..row
                    });
                }
                if met {
                    break;
                }
            }
            r.rows.extend(kept);
            bar.inc(1);
        }
    }
    Ok(running.into_iter().map(|r| r.rows).collect())
}

/// A service name for a configuration (short: it becomes a socket path).
fn ctx_service_suffix(config: &Config) -> String {
    format!("{}.{}", config.mode.replace('/', "-"), config.connections)
}
