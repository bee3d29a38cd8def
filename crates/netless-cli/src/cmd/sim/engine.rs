//! The engine of `netless sim`: one run of a k-worker FIFO server under Poisson arrivals,
//! measured in units of the mean service time S; it owns the random streams and the
//! statistics of a run and never prints.
//!
//! No event heap is needed. Arrivals come in time order, and every request's start time is
//! known the moment it arrives:
//!
//! - single queue (M/G/k FIFO): an arrival takes the worker that frees earliest, which is the
//!   worker that would pick it up as the oldest waiting request; the workers' next-free times
//!   live in a min-heap;
//! - partitioned: an arrival joins a uniformly random worker's private FIFO, which frees at
//!   that worker's next-free time (k independent M/G/1 queues fed by one Poisson stream).
//!
//! The queue an arrival sees is the number of earlier requests that have not started by its
//! arrival time (waiting, not in service; for `partitioned`, summed over all workers, which is
//! what the receive buffers hold). Its average over arrivals is, by PASTA, the time-average
//! queue length E\[Nq\].
//!
//! Interarrival gaps are unit exponentials scaled by 1/λ, and the arrival, service and
//! dispatch streams are separate, so runs with one seed at different loads see the same
//! requests arriving more or less densely (common random numbers): waiting times, and hence
//! the latency percentiles, are then non-decreasing in the load, which keeps a bisection on
//! the load consistent.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Service-time distributions of NEBULA §IV-C (from ZygOS), each with mean 1 (= S).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Distribution {
    /// Every request takes exactly S.
    Deterministic,
    /// Exponential with mean S.
    Exponential,
    /// S/2 with probability 0.9, 5.5 × S with probability 0.1.
    Bimodal,
}

impl Distribution {
    /// All three, in NEBULA Table I's order.
    pub(super) const ALL: [Distribution; 3] = [
        Distribution::Deterministic,
        Distribution::Exponential,
        Distribution::Bimodal,
    ];

    /// Capitalised name, as in NEBULA Table I's rows.
    pub(super) fn title(self) -> &'static str {
        match self {
            Distribution::Deterministic => "Deterministic",
            Distribution::Exponential => "Exponential",
            Distribution::Bimodal => "Bimodal",
        }
    }

    /// Draws one service time (in units of S).
    fn sample(self, rng: &mut Rng) -> f64 {
        match self {
            Distribution::Deterministic => 1.0,
            Distribution::Exponential => rng.exponential(),
            Distribution::Bimodal => {
                if rng.unit() <= 0.9 {
                    0.5
                } else {
                    5.5
                }
            }
        }
    }
}

/// How arrivals are assigned to workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Dispatch {
    /// One FIFO shared by all workers; an idle worker takes the oldest request (RPCValet,
    /// NEBULA).
    Single,
    /// Each arrival joins a uniformly random worker's private FIFO (RSS, SRQ).
    Partitioned,
}

impl Dispatch {
    /// Both policies, single queue first.
    pub(super) const ALL: [Dispatch; 2] = [Dispatch::Single, Dispatch::Partitioned];

    /// Name for table headings.
    pub(super) fn title(self) -> &'static str {
        match self {
            Dispatch::Single => "single queue",
            Dispatch::Partitioned => "partitioned",
        }
    }
}

/// The server being simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Scenario {
    /// Workers (cores), `k`.
    pub workers: u32,
    /// Service-time distribution.
    pub distribution: Distribution,
    /// Dispatch policy.
    pub dispatch: Dispatch,
}

/// One run of a [`Scenario`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Run {
    /// Utilisation ρ = λ·S/k, in (0, 1) for a stable queue.
    pub load: f64,
    /// Requests measured.
    pub requests: u64,
    /// Requests simulated first and left out of the statistics (the server starts empty).
    pub warmup: u64,
    /// Seed of the random streams.
    pub seed: u64,
}

/// What a run measured; times in units of S, queues in requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(super) struct Measured {
    /// Requests measured (after the warm-up).
    pub requests: u64,
    /// Mean latency (arrival to completion).
    pub mean_latency: f64,
    /// 99th-percentile latency.
    pub p99_latency: f64,
    /// Mean number of requests waiting (not in service) seen by an arrival; by PASTA the
    /// time-average E\[Nq\].
    pub mean_queue: f64,
    /// 99th percentile of the number waiting seen by an arrival.
    pub p99_queue: u64,
    /// Most requests ever seen waiting by an arrival.
    pub max_queue: u64,
}

/// Latencies are recorded in thousandths of S.
const LATENCY_SCALE: f64 = 1000.0;
/// Longest latency recorded as itself, in thousandths of S (longer ones count as this).
const LATENCY_MAX: u64 = 1_000_000_000_000;

/// Simulates `run.warmup + run.requests` arrivals at `scenario`'s server and measures the
/// last `run.requests`. Deterministic in `(scenario, run)`.
pub(super) fn simulate(scenario: &Scenario, run: &Run) -> Measured {
    let k = scenario.workers.max(1);
    let rate = f64::from(k) * run.load;
    let mut arrivals = Rng::new(run.seed, 1);
    let mut services = Rng::new(run.seed, 2);
    let mut dispatches = Rng::new(run.seed, 3);
    let mut server = match scenario.dispatch {
        Dispatch::Single => Server::single(k),
        Dispatch::Partitioned => Server::partitioned(k),
    };
    let mut stats = Stats::new();
    let mut now = 0.0;
    for n in 0..run.warmup + run.requests {
        now += arrivals.exponential() / rate;
        let service = scenario.distribution.sample(&mut services);
        let (queued, finish) = server.admit(now, service, &mut dispatches);
        if n >= run.warmup {
            stats.record(finish - now, queued);
        }
    }
    stats.finish()
}

/// The dispatch state: when each worker frees and which admitted requests still wait.
enum Server {
    /// Workers' next-free times; start times of waiting requests, which a FIFO single queue
    /// hands out in arrival order, so that they are non-decreasing.
    Single { free_at: MinHeap, waiting: Fifo },
    /// Each worker's next-free time; start times of waiting requests.
    Partitioned { free_at: Vec<f64>, waiting: MinHeap },
}

impl Server {
    fn single(k: u32) -> Server {
        Server::Single {
            free_at: MinHeap::filled(k as usize, 0.0),
            waiting: Fifo::default(),
        }
    }

    fn partitioned(k: u32) -> Server {
        Server::Partitioned {
            free_at: vec![0.0; k as usize],
            waiting: MinHeap::default(),
        }
    }

    /// Admits a request arriving at `now` needing `service`: returns how many requests were
    /// waiting when it arrived and when it completes.
    fn admit(&mut self, now: f64, service: f64, dispatches: &mut Rng) -> (usize, f64) {
        match self {
            Server::Single { free_at, waiting } => {
                waiting.drop_up_to(now);
                let queued = waiting.len();
                let start = free_at.min().max(now);
                let finish = start + service;
                free_at.replace_min(finish);
                if start > now {
                    waiting.push(start);
                }
                (queued, finish)
            }
            Server::Partitioned { free_at, waiting } => {
                while !waiting.is_empty() && waiting.min() <= now {
                    waiting.pop_min();
                }
                let queued = waiting.len();
                let worker = dispatches.below(free_at.len() as u32) as usize;
                let start = free_at[worker].max(now);
                let finish = start + service;
                free_at[worker] = finish;
                if start > now {
                    waiting.push(start);
                }
                (queued, finish)
            }
        }
    }
}

/// A binary min-heap of times (never NaN here). Hand-written rather than
/// `BinaryHeap<Reverse<_>>` for a cheap replace-the-minimum, and because it is several times
/// faster in unoptimised builds, where the tests run the simulator.
#[derive(Debug, Default)]
struct MinHeap {
    items: Vec<f64>,
}

impl MinHeap {
    /// `n` copies of `time`.
    fn filled(n: usize, time: f64) -> MinHeap {
        MinHeap {
            items: vec![time; n],
        }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The earliest time; the heap must not be empty.
    fn min(&self) -> f64 {
        self.items[0]
    }

    fn push(&mut self, time: f64) {
        let items = &mut self.items;
        let mut child = items.len();
        items.push(time);
        let items = items.as_mut_slice();
        while child > 0 {
            let parent = (child - 1) / 2;
            if items[parent] <= time {
                break;
            }
            items[child] = items[parent];
            child = parent;
        }
        items[child] = time;
    }

    /// Removes the earliest time; the heap must not be empty.
    fn pop_min(&mut self) {
        let last = self.items.pop().expect("pop_min on an empty heap");
        if !self.items.is_empty() {
            self.replace_min(last);
        }
    }

    /// Replaces the earliest time by `time`; the heap must not be empty.
    fn replace_min(&mut self, time: f64) {
        // A slice, not the Vec: indexing it is built in, which matters in unoptimised builds.
        let items = self.items.as_mut_slice();
        let n = items.len();
        let mut parent = 0;
        loop {
            let left = 2 * parent + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && items[right] < items[left] {
                right
            } else {
                left
            };
            if time <= items[child] {
                break;
            }
            items[parent] = items[child];
            parent = child;
        }
        items[parent] = time;
    }
}

/// A FIFO of non-decreasing times: a vector and the index of its head, compacted now and then.
#[derive(Debug, Default)]
struct Fifo {
    items: Vec<f64>,
    head: usize,
}

impl Fifo {
    fn len(&self) -> usize {
        self.items.len() - self.head
    }

    fn push(&mut self, time: f64) {
        self.items.push(time);
    }

    /// Drops the times at or before `now` from the head.
    fn drop_up_to(&mut self, now: f64) {
        while self.head < self.items.len() && self.items[self.head] <= now {
            self.head += 1;
        }
        if self.head == self.items.len() {
            self.items.clear();
            self.head = 0;
        } else if self.head >= 4096 && self.head * 2 >= self.items.len() {
            self.items.drain(..self.head);
            self.head = 0;
        }
    }
}

/// Accumulates a run's latencies and observed queue lengths.
struct Stats {
    latencies: Histogram<u64>,
    latency_sum: f64,
    /// `queue_counts[q]`: arrivals that saw `q` requests waiting.
    queue_counts: Vec<u64>,
    queue_sum: u64,
    requests: u64,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            latencies: Histogram::new_with_bounds(1, LATENCY_MAX, 3)
                .expect("valid bounds and precision"),
            latency_sum: 0.0,
            queue_counts: Vec::new(),
            queue_sum: 0,
            requests: 0,
        }
    }

    fn record(&mut self, latency: f64, queued: usize) {
        self.latencies
            .saturating_record((latency * LATENCY_SCALE + 0.5) as u64);
        self.latency_sum += latency;
        if queued >= self.queue_counts.len() {
            self.queue_counts.resize(queued + 1, 0);
        }
        self.queue_counts[queued] += 1;
        self.queue_sum += queued as u64;
        self.requests += 1;
    }

    fn finish(self) -> Measured {
        let n = self.requests.max(1);
        // The smallest depth at or below which at least 99% of arrivals found the queue.
        let target = (self.requests as f64 * 0.99).ceil() as u64;
        let mut seen = 0;
        let p99_queue = self
            .queue_counts
            .iter()
            .position(|&count| {
                seen += count;
                seen >= target
            })
            .unwrap_or(0) as u64;
        Measured {
            requests: self.requests,
            mean_latency: self.latency_sum / n as f64,
            p99_latency: self.latencies.value_at_quantile(0.99) as f64 / LATENCY_SCALE,
            mean_queue: self.queue_sum as f64 / n as f64,
            p99_queue,
            max_queue: self.queue_counts.len().saturating_sub(1) as u64,
        }
    }
}

/// xoshiro256++ seeded through splitmix64: small, fast and good enough for simulation; one
/// instance per random stream.
pub(super) struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// The stream `stream` of seed `seed`; different streams of one seed are independent
    /// for any practical purpose.
    pub(super) fn new(seed: u64, stream: u64) -> Rng {
        let mut x = seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            state: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub(super) fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in (0, 1], 53 bits.
    pub(super) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Exponential with mean 1, by inverse transform.
    pub(super) fn exponential(&mut self) -> f64 {
        -self.unit().ln()
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2⁻³² for any `n`).
    pub(super) fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(workers: u32, distribution: Distribution, dispatch: Dispatch, load: f64) -> Measured {
        let scenario = Scenario {
            workers,
            distribution,
            dispatch,
        };
        simulate(
            &scenario,
            &Run {
                load,
                requests: 400_000,
                warmup: 20_000,
                seed: 7,
            },
        )
    }

    /// Pollaczek–Khinchine: an M/G/1 request waits λ·E[X²] / (2(1 − ρ)) on average.
    fn pollaczek_khinchine_wait(rho: f64, second_moment: f64) -> f64 {
        rho * second_moment / (2.0 * (1.0 - rho))
    }

    fn assert_close(what: &str, got: f64, want: f64, tolerance: f64) {
        let error = (got - want).abs() / want;
        assert!(
            error < tolerance,
            "{what}: got {got}, want {want} ({error:.3} off)"
        );
    }

    #[test]
    fn md1_mean_wait_is_pollaczek_khinchine() {
        // E[X²] = 1: W = ρ / (2(1 − ρ)); E[Nq] = λW.
        let rho = 0.6;
        let m = run(1, Distribution::Deterministic, Dispatch::Single, rho);
        let wait = pollaczek_khinchine_wait(rho, 1.0);
        assert_close("M/D/1 wait", m.mean_latency - 1.0, wait, 0.03);
        assert_close("M/D/1 E[Nq]", m.mean_queue, rho * wait, 0.03);
    }

    #[test]
    fn bimodal_partitioned_workers_are_mg1_queues() {
        // E[X²] = 0.9 · 0.25 + 0.1 · 30.25 = 3.25; each of 4 workers is an M/G/1 at ρ.
        let rho = 0.5;
        let m = run(4, Distribution::Bimodal, Dispatch::Partitioned, rho);
        let wait = pollaczek_khinchine_wait(rho, 3.25);
        assert_close("M/G/1 wait", m.mean_latency - 1.0, wait, 0.05);
        // Summed over 4 workers, each with E[Nq] = ρ·W.
        assert_close("4 × M/G/1 E[Nq]", m.mean_queue, 4.0 * rho * wait, 0.05);
    }

    #[test]
    fn mm1_mean_queue_matches_erlang_c() {
        let rho = 0.5;
        let m = run(1, Distribution::Exponential, Dispatch::Single, rho);
        let want = netless::sizing::mean_queue_len(1, rho);
        assert_close("M/M/1 E[Nq]", m.mean_queue, want, 0.05);
    }

    #[test]
    fn one_worker_is_the_same_under_both_policies() {
        for distribution in Distribution::ALL {
            let single = run(1, distribution, Dispatch::Single, 0.7);
            let partitioned = run(1, distribution, Dispatch::Partitioned, 0.7);
            assert_eq!(single, partitioned, "{distribution:?}");
        }
    }

    #[test]
    fn deterministic_in_the_seed() {
        let a = run(8, Distribution::Exponential, Dispatch::Partitioned, 0.8);
        let b = run(8, Distribution::Exponential, Dispatch::Partitioned, 0.8);
        assert_eq!(a, b);
    }

    #[test]
    fn latency_grows_with_load_under_common_random_numbers() {
        let mut previous = run(16, Distribution::Bimodal, Dispatch::Single, 0.5);
        for load in [0.7, 0.8, 0.9, 0.95] {
            let m = run(16, Distribution::Bimodal, Dispatch::Single, load);
            assert!(
                m.p99_latency >= previous.p99_latency,
                "{load}: {m:?} < {previous:?}"
            );
            assert!(
                m.mean_queue >= previous.mean_queue,
                "{load}: {m:?} < {previous:?}"
            );
            previous = m;
        }
    }

    #[test]
    fn pooling_beats_partitioning() {
        let single = run(16, Distribution::Exponential, Dispatch::Single, 0.8);
        let partitioned = run(16, Distribution::Exponential, Dispatch::Partitioned, 0.8);
        assert!(single.p99_latency < partitioned.p99_latency);
        assert!(single.mean_queue < partitioned.mean_queue);
    }

    #[test]
    fn heap_and_fifo_give_times_in_order() {
        let mut rng = Rng::new(5, 5);
        let mut heap = MinHeap::default();
        let mut times: Vec<f64> = (0..1000).map(|_| rng.exponential()).collect();
        for &t in &times {
            heap.push(t);
        }
        // Replacing the minimum by a larger time, as the single queue does.
        for _ in 0..500 {
            let t = heap.min() + rng.exponential();
            let old = heap.min();
            let i = times
                .iter()
                .position(|&x| x == old)
                .expect("the minimum is a pushed time");
            times[i] = t;
            heap.replace_min(t);
        }
        times.sort_by(f64::total_cmp);
        let mut popped = Vec::new();
        while !heap.is_empty() {
            popped.push(heap.min());
            heap.pop_min();
        }
        assert_eq!(popped, times);

        let mut fifo = Fifo::default();
        for i in 0..10_000 {
            fifo.push(f64::from(i));
        }
        fifo.drop_up_to(4999.5);
        assert_eq!(fifo.len(), 5000);
        fifo.drop_up_to(9999.0);
        assert_eq!(fifo.len(), 0);
    }

    #[test]
    fn service_times_have_mean_one() {
        let mut rng = Rng::new(3, 9);
        for distribution in Distribution::ALL {
            let n = 200_000;
            let mean = (0..n).map(|_| distribution.sample(&mut rng)).sum::<f64>() / n as f64;
            assert_close(&format!("{distribution:?} mean"), mean, 1.0, 0.02);
        }
        let n = 100_000;
        let hits = (0..n).filter(|_| rng.below(10) == 3).count();
        assert_close("below(10)", hits as f64, n as f64 / 10.0, 0.03);
    }
}
