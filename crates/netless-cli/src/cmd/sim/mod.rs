//! `netless sim`: NEBULA's queueing study (§III, §IV-C) of a k-worker server, single queue vs
//! partitioned, with the Table I search for the highest load meeting an SLO and a self-check
//! against Erlang-C; `engine` simulates one run, `report` prints and writes the results.
//!
//! Times are in units of the mean service time S and loads are utilisations ρ = λ·S/k. Every
//! run uses the same seed, so its results depend on nothing but the arguments (not on the
//! number of threads the runs are spread over).
//!
//! Near a utilisation of 1 a queue forgets its empty start only after some 1/(k(1 − √ρ)²)
//! service times, so the percentiles of a run of N requests are those of the steady state
//! only while N/(kρ) is well beyond that: at k = 64 the default million requests reach it
//! up to ρ ≈ 0.99, not at 0.999 (62,500 service times), where the SLO search then errs high.

mod engine;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use engine::{Dispatch, Distribution, Run, Scenario};
use report::{CheckRow, PointRow, Report, SloRow};

/// Requests measured per sweep point and bisection step by default.
const DEFAULT_REQUESTS: u64 = 1_000_000;
/// Requests per sweep point and bisection step with `--quick`.
const QUICK_REQUESTS: u64 = 50_000;
/// Utilisations of the Erlang-C check: loads at which even 64 workers queue often enough for
/// E\[Nq\] to be estimated to a few percent (at ρ = 0.5 their E\[Nq\] is 3·10⁻⁹, at 0.7
/// 0.01).
const CHECK_LOADS: [f64; 4] = [0.8, 0.85, 0.9, 0.95];
/// Length of an Erlang-C check run by default, in mean service times (at least 16 workers'
/// worth: see [`check_requests`]). The queue length is strongly correlated in time, so its
/// mean converges slowly: over 12 seeds at k = 16 and 64, the relative error of the simulated
/// E\[Nq\] had a standard deviation of 0.6–1.2% at the check loads, so the 5% tolerance is more
/// than 4 of them away.
const DEFAULT_CHECK_LENGTH: f64 = 1e6;
/// Utilisations of the `--quick` check: two whose E\[Nq\] converges fast at both k = 16 and 64.
const QUICK_CHECK_LOADS: [f64; 2] = [0.85, 0.9];
/// Length of a `--quick` check run: over 26 seeds, a standard deviation of 1.0–1.3% at its
/// loads (3.8 or more of them within the tolerance).
const QUICK_CHECK_LENGTH: f64 = 5e5;
/// Largest relative error of the simulated mean queue length that passes the check.
const CHECK_TOLERANCE: f64 = 0.05;
/// Halvings of the load interval [0, 1] when searching the highest load meeting the SLO:
/// 2⁻¹⁰ < 0.001.
const BISECTION_STEPS: u32 = 10;

/// Service-time distributions to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DistributionChoice {
    /// Every request takes exactly S.
    Deterministic,
    /// Exponential with mean S.
    Exponential,
    /// S/2 with probability 0.9, 5.5·S with probability 0.1.
    Bimodal,
    /// All three.
    All,
}

/// Dispatch policies to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DispatchChoice {
    /// One FIFO shared by all workers.
    Single,
    /// A private FIFO per worker, each arrival to a uniformly random one.
    Partitioned,
    /// Both.
    Both,
}

/// Arguments of `netless sim`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workers (cores), k; a comma-separated list simulates each.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub workers: Vec<u32>,
    /// Service-time distribution (mean S).
    #[arg(long, value_enum, default_value_t = DistributionChoice::All)]
    pub dist: DistributionChoice,
    /// Dispatch policy.
    #[arg(long, value_enum, default_value_t = DispatchChoice::Both)]
    pub dispatch: DispatchChoice,
    /// Utilisations of the load sweep, each in (0, 1).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.5,0.6,0.7,0.8,0.85,0.9,0.95,0.97,0.99"
    )]
    pub loads: Vec<f64>,
    /// Requests measured per sweep point and bisection step, after a warm-up of a tenth as
    /// many [default: 1000000, 50000 with --quick].
    #[arg(long)]
    pub requests: Option<u64>,
    /// Length of each Erlang-C check run in mean service times S, i.e. T·max(k, 16)·ρ
    /// requests [default: 1000000, 500000 with --quick].
    #[arg(long)]
    pub check_length: Option<f64>,
    /// Seed of the random streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The SLO: p99 latency at most this many mean service times.
    #[arg(long, default_value_t = 10.0)]
    pub slo_factor: f64,
    /// Also write every row as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fewer requests per run, and an Erlang-C check at two loads instead of four (for tests
    /// and a first look).
    #[arg(long)]
    pub quick: bool,
}

/// Runs the sweeps, the SLO search and the Erlang-C check, and prints them; exits 1 if a
/// check row fails.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let plan = Plan::from_args(&args)?;
    let started = Instant::now();
    let jobs = plan.jobs();
    let total: u64 = jobs.iter().map(|job| plan.arrivals(job)).sum();
    let bar = ProgressBar::new(total)
        .with_message("netless sim")
        .with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {percent}% of {len} arrivals, {eta} left",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    let outcomes = run_jobs(&plan, &jobs, &bar);
    bar.finish_and_clear();

    let mut report = Report {
        experiment: "sim",
        time_unit: "mean service time S",
        queue_measure: "requests waiting (not in service) seen by an arrival; by PASTA the \
                        time average",
        seed: plan.seed,
        requests: plan.requests,
        warmup: warmup(plan.requests),
        check_length: plan.check_length,
        slo: plan.slo,
        check_tolerance: CHECK_TOLERANCE,
        points: Vec::new(),
        max_load_at_slo: Vec::new(),
        erlang_c_check: Vec::new(),
        check_passed: None,
    };
    for outcome in outcomes {
        match outcome {
            Outcome::Point(row) => report.points.push(row),
            Outcome::Slo(row) => report.max_load_at_slo.push(row),
            Outcome::Check(row) => report.erlang_c_check.push(row),
        }
    }
    if plan.check {
        report.check_passed = Some(report.erlang_c_check.iter().all(|row| row.pass));
    }

    println!(
        "netless sim: k-worker server, Poisson arrivals; times in units of the mean service \
         time S; {} requests per sweep point and bisection step after {} of warm-up; seed {}",
        report.requests, report.warmup, report.seed
    );
    println!(
        "queue = {} (partitioned: summed over the workers)\n",
        report.queue_measure
    );
    print!("{}", report.sweep_tables());
    print!("{}", report.slo_tables());
    if plan.check {
        print!("{}", report.check_table());
    } else {
        println!(
            "Erlang-C check not run: it applies to exponential service on a single queue \
             (--dist exponential or all, --dispatch single or both)."
        );
    }
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    eprintln!(
        "netless sim: {total} arrivals simulated in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(match report.check_passed {
        Some(false) => {
            eprintln!("netless sim: the simulator disagrees with Erlang-C (FAIL rows above)");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    })
}

/// What to simulate, validated.
struct Plan {
    workers: Vec<u32>,
    distributions: Vec<Distribution>,
    dispatches: Vec<Dispatch>,
    loads: Vec<f64>,
    requests: u64,
    check_length: f64,
    check_loads: &'static [f64],
    seed: u64,
    slo: f64,
    /// Whether the Erlang-C check applies (exponential service on a single queue selected).
    check: bool,
}

impl Plan {
    fn from_args(args: &Args) -> anyhow::Result<Plan> {
        let mut workers = Vec::new();
        for &k in &args.workers {
            anyhow::ensure!(
                k >= 1,
                "--workers: a server needs at least 1 worker, not {k}"
            );
            if !workers.contains(&k) {
                workers.push(k);
            }
        }
        anyhow::ensure!(
            !workers.is_empty(),
            "--workers: give at least one worker count"
        );
        anyhow::ensure!(!args.loads.is_empty(), "--loads: give at least one load");
        for &load in &args.loads {
            anyhow::ensure!(
                load.is_finite() && load > 0.0,
                "--loads: {load} is not a utilisation above 0"
            );
            anyhow::ensure!(
                load < 1.0,
                "--loads: {load} is not below 1: at a utilisation of 1 or more the queue grows \
                 without bound"
            );
        }
        anyhow::ensure!(
            args.slo_factor.is_finite() && args.slo_factor > 0.0,
            "--slo-factor: {} is not a positive number of mean service times",
            args.slo_factor
        );
        let (requests, check_length, check_loads) = if args.quick {
            (QUICK_REQUESTS, QUICK_CHECK_LENGTH, &QUICK_CHECK_LOADS[..])
        } else {
            (DEFAULT_REQUESTS, DEFAULT_CHECK_LENGTH, &CHECK_LOADS[..])
        };
        let requests = args.requests.unwrap_or(requests);
        let check_length = args.check_length.unwrap_or(check_length);
        anyhow::ensure!(
            requests >= 100,
            "--requests: {requests} is too few for a 99th percentile; give at least 100"
        );
        anyhow::ensure!(
            check_length.is_finite() && check_length >= 100.0,
            "--check-length: {check_length} is too short; give at least 100 service times"
        );
        let distributions = match args.dist {
            DistributionChoice::Deterministic => vec![Distribution::Deterministic],
            DistributionChoice::Exponential => vec![Distribution::Exponential],
            DistributionChoice::Bimodal => vec![Distribution::Bimodal],
            DistributionChoice::All => Distribution::ALL.to_vec(),
        };
        let dispatches = match args.dispatch {
            DispatchChoice::Single => vec![Dispatch::Single],
            DispatchChoice::Partitioned => vec![Dispatch::Partitioned],
            DispatchChoice::Both => Dispatch::ALL.to_vec(),
        };
        let check = distributions.contains(&Distribution::Exponential)
            && dispatches.contains(&Dispatch::Single);
        Ok(Plan {
            workers,
            distributions,
            dispatches,
            loads: args.loads.clone(),
            requests,
            check_length,
            check_loads,
            seed: args.seed,
            slo: args.slo_factor,
            check,
        })
    }

    /// Every run to make, longest first (the bisections, then the checks) so that the threads
    /// finish together; the results keep this order.
    fn jobs(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for &workers in &self.workers {
            for &dispatch in &self.dispatches {
                for &distribution in &self.distributions {
                    jobs.push(Job::MaxLoadAtSlo(Scenario {
                        workers,
                        distribution,
                        dispatch,
                    }));
                }
            }
        }
        if self.check {
            for &workers in &self.workers {
                for &load in self.check_loads {
                    jobs.push(Job::Check { workers, load });
                }
            }
        }
        for &workers in &self.workers {
            for &distribution in &self.distributions {
                for &dispatch in &self.dispatches {
                    for &load in &self.loads {
                        let scenario = Scenario {
                            workers,
                            distribution,
                            dispatch,
                        };
                        jobs.push(Job::Point { scenario, load });
                    }
                }
            }
        }
        jobs
    }

    /// Arrivals `job` simulates, warm-up included (for the progress bar).
    fn arrivals(&self, job: &Job) -> u64 {
        match *job {
            Job::Point { .. } => self.requests + warmup(self.requests),
            Job::MaxLoadAtSlo(_) => {
                u64::from(BISECTION_STEPS) * (self.requests + warmup(self.requests))
            }
            Job::Check { workers, load } => {
                let requests = check_requests(self.check_length, workers, load);
                requests + warmup(requests)
            }
        }
    }

    fn run(&self, load: f64, requests: u64) -> Run {
        Run {
            load,
            requests,
            warmup: warmup(requests),
            seed: self.seed,
        }
    }

    fn execute(&self, job: &Job, bar: &ProgressBar) -> Outcome {
        match *job {
            Job::Point { scenario, load } => {
                let measured = engine::simulate(&scenario, &self.run(load, self.requests));
                bar.inc(self.arrivals(job));
                Outcome::Point(PointRow {
                    workers: scenario.workers,
                    distribution: scenario.distribution,
                    dispatch: scenario.dispatch,
                    load,
                    measured,
                    meets_slo: measured.p99_latency <= self.slo,
                })
            }
            Job::MaxLoadAtSlo(scenario) => Outcome::Slo(self.max_load_at_slo(&scenario, bar)),
            Job::Check { workers, load } => {
                let scenario = Scenario {
                    workers,
                    distribution: Distribution::Exponential,
                    dispatch: Dispatch::Single,
                };
                let requests = check_requests(self.check_length, workers, load);
                let measured = engine::simulate(&scenario, &self.run(load, requests));
                bar.inc(self.arrivals(job));
                let offered_load = f64::from(workers) * load;
                let erlang_c = netless::sizing::mean_queue_len(workers, offered_load);
                let relative_error = (measured.mean_queue - erlang_c) / erlang_c;
                Outcome::Check(CheckRow {
                    workers,
                    load,
                    offered_load,
                    requests: measured.requests,
                    simulated_mean_queue: measured.mean_queue,
                    erlang_c_mean_queue: erlang_c,
                    relative_error,
                    pass: relative_error.abs() <= CHECK_TOLERANCE,
                })
            }
        }
    }

    /// Bisects the utilisation in [0, 1] for the highest at which the p99 latency meets the
    /// SLO. With one seed for every step the p99 latency is non-decreasing in the load (see
    /// `engine`), so the bisection cannot be misled by noise between steps.
    fn max_load_at_slo(&self, scenario: &Scenario, bar: &ProgressBar) -> SloRow {
        let (mut low, mut high) = (0.0, 1.0);
        let mut best = None;
        for _ in 0..BISECTION_STEPS {
            let load = (low + high) / 2.0;
            let run = self.run(load, self.requests);
            let measured = engine::simulate(scenario, &run);
            bar.inc(run.requests + run.warmup);
            if measured.p99_latency <= self.slo {
                low = load;
                best = Some(measured);
            } else {
                high = load;
            }
        }
        SloRow {
            workers: scenario.workers,
            distribution: scenario.distribution,
            dispatch: scenario.dispatch,
            slo: self.slo,
            max_load: best.map(|_| low),
            load_resolution: high - low,
            at_max_load: best,
            erlang_c_max_load: (scenario.distribution == Distribution::Exponential
                && scenario.dispatch == Dispatch::Single)
                .then(|| {
                    netless::sizing::max_load_for_slo(scenario.workers, self.slo)
                        / f64::from(scenario.workers)
                }),
        }
    }
}

/// Requests measured in an Erlang-C check run of `length` mean service times of `workers`
/// at utilisation `load`. Fewer than 16 workers get proportionally longer runs: their queue
/// fluctuates more slowly, and a run of as many requests as for 16 costs no more.
fn check_requests(length: f64, workers: u32, load: f64) -> u64 {
    (length * f64::from(workers.max(16)) * load).ceil() as u64
}

/// Requests simulated before a run's measurement starts: a tenth of those measured.
fn warmup(requests: u64) -> u64 {
    requests / 10
}

/// One unit of work for a thread.
#[derive(Clone, Copy, Debug)]
enum Job {
    /// One point of a load sweep.
    Point { scenario: Scenario, load: f64 },
    /// The bisection for the highest load meeting the SLO.
    MaxLoadAtSlo(Scenario),
    /// One row of the Erlang-C check.
    Check { workers: u32, load: f64 },
}

/// What a [`Job`] found.
enum Outcome {
    Point(PointRow),
    Slo(SloRow),
    Check(CheckRow),
}

/// Runs `jobs` on one thread per available CPU; the outcomes come back in `jobs`' order.
fn run_jobs(plan: &Plan, jobs: &[Job], bar: &ProgressBar) -> Vec<Outcome> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut outcomes: Vec<Option<Outcome>> = jobs.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        // Relaxed: the counter only hands out distinct indices.
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        done.push((i, plan.execute(job, bar)));
                    }
                    done
                })
            })
            .collect();
        for worker in workers {
            for (i, outcome) in worker.join().expect("a simulation thread panicked") {
                outcomes[i] = Some(outcome);
            }
        }
    });
    outcomes
        .into_iter()
        .map(|outcome| outcome.expect("every job ran"))
        .collect()
}
