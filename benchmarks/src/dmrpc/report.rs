//! What `pass_by_reference` reports: a [`Row`] per variant of each measured point, the
//! acceptance figures computed from the rows ([`Summary`]), and the JSON document that holds
//! them with the configuration ([`Doc`]). Field names and order are the JSON's, which other
//! tools read. Nothing here measures or prints.

use serde::Serialize;

use super::transfer::TransferRow;
use super::{Forward, Placement, CHAIN_SIZES, LB_SIZES, MAX_HOPS};
use crate::harness::json::Machine;
use crate::harness::stats::{median_of_ratios, ratio};

/// One result row (JSON and tables). Fields that do not apply to an experiment are `null`.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Row {
    /// `nested_chain`, `cow` or `load_balancer`.
    pub(super) experiment: &'static str,
    /// `by_value` / `by_ref` (chain, load balancer) or `cow` / `copy`.
    pub(super) variant: &'static str,
    /// Array, buffer or payload size.
    pub(super) size_bytes: usize,
    /// RPC calls in the chain (tiers); 2 for the load balancer (client → lb → worker).
    pub(super) hops: Option<u32>,
    /// Part of the buffer the callee wrote (cow experiment).
    pub(super) write_fraction: Option<f64>,
    /// Calls (operations) kept in flight.
    pub(super) in_flight: usize,
    /// Calls (operations) measured, each verified.
    pub(super) calls: u64,
    /// Calls per second.
    pub(super) throughput_per_s: f64,
    /// Mean latency of a call as the client saw it, µs.
    pub(super) avg_latency_us: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    /// Bytes copied per call by all processes involved: payload bytes put into netless
    /// messages plus pool copies.
    pub(super) bytes_copied_per_call: f64,
    /// Payload bytes copied into netless messages (by-value sends), all processes.
    pub(super) payload_bytes_copied_per_call: f64,
    /// `PoolStats::bytes_copied`, all processes.
    pub(super) pool_bytes_copied_per_call: f64,
    /// `PoolStats::pages_copied`, all processes.
    pub(super) pages_copied_per_call: f64,
    /// Ref bytes sent, all processes.
    pub(super) handle_bytes_per_call: f64,
    /// Refs mapped, all processes (1 per call by reference: the last tier's).
    pub(super) maps_per_call: f64,
    /// Load balancer: bytes the forwarder copied (payload + pool).
    pub(super) forwarder_bytes_copied_per_call: Option<f64>,
    pub(super) forwarder_payload_bytes_copied_per_call: Option<f64>,
    pub(super) forwarder_pool_bytes_copied_per_call: Option<f64>,
    pub(super) forwarder_handle_bytes_per_call: Option<f64>,
    /// Load balancer: CPU time the forwarder process used per request, µs (from
    /// `/proc/PID/stat`, in clock ticks, over all the windows of the row).
    pub(super) forwarder_cpu_us_per_call: Option<f64>,
    /// Cow experiment: `create_ref` as DmRPC times it, µs: `share()` in the client plus the
    /// callee's `map`, plus (copy variant) the callee's private copy.
    pub(super) create_ref_us: Option<f64>,
    pub(super) share_us: Option<f64>,
    pub(super) map_us: Option<f64>,
    /// The callee's copy of the whole buffer (copy variant; 0 for cow).
    pub(super) copy_us: Option<f64>,
    pub(super) write_us: Option<f64>,
    /// The callee's release of the buffer it wrote (its mapping, or its private copy).
    pub(super) unmap_us: Option<f64>,
    /// Throughput over the same point's baseline row (`by_ref` / `by_value`, `cow` / `copy`),
    /// from the totals; 1 on baseline rows.
    pub(super) ratio_vs_baseline: Option<f64>,
    /// The same ratio, as the median over the interleaved rounds of the ratio within each
    /// round (robust against a busy host during part of the run).
    pub(super) ratio_median_of_rounds: Option<f64>,
    /// Throughput of each interleaved round, calls/s.
    pub(super) round_throughputs_per_s: Vec<f64>,
    /// Every reply was checked (sums; for cow, the callee's view and the client's buffer
    /// afterwards).
    pub(super) verified: bool,
    /// Calls retried after RESOURCE_EXHAUSTED (a full receive buffer somewhere).
    pub(super) retries: u64,
}

/// The JSON document: `{"experiment":"dmrpc","machine":{…},"config":{…},"rows":[Row, …],
/// "summary":{…}}`.
#[derive(Serialize)]
pub(super) struct Doc<'a> {
    pub(super) experiment: &'static str,
    pub(super) machine: Machine,
    pub(super) config: Config,
    pub(super) rows: &'a [Row],
    pub(super) summary: &'a Summary,
    /// (d): sequential call latency by value and by reference per payload size.
    pub(super) transfer: &'a [TransferRow],
    /// The smallest measured size from which by reference was faster at every size.
    pub(super) crossover_bytes: Option<usize>,
    /// (d) again, through a memory fabric region: segments and the domain's pool in it.
    pub(super) transfer_fabric: &'a [TransferRow],
}

/// How the run was made.
#[derive(Serialize)]
pub(super) struct Config {
    pub(super) in_flight: usize,
    pub(super) window_ms: u64,
    pub(super) rounds: u32,
    pub(super) spin_us: u64,
    pub(super) placement: Placement,
    pub(super) forward: Forward,
    pub(super) quick: bool,
}

/// The figures the acceptance criteria name.
#[derive(Debug, Default, Serialize)]
pub(super) struct Summary {
    /// Nested chain, 7 hops, 64 KiB: by-ref throughput / by-value throughput (median of the
    /// interleaved rounds' ratios).
    pub(super) chain_7hop_64k_ref_over_value: Option<f64>,
    /// The same from the totals.
    pub(super) chain_7hop_64k_ref_over_value_totals: Option<f64>,
    /// By reference, per size: 7-hop throughput / 1-hop throughput.
    pub(super) chain_ref_7hop_over_1hop: Vec<SizeRatio>,
    /// By value, per size: 7-hop throughput / 1-hop throughput.
    pub(super) chain_value_7hop_over_1hop: Vec<SizeRatio>,
    /// 1 MiB, 0% written: cow throughput / copy throughput (whole operations).
    pub(super) cow_1m_0pct_ops_ratio: Option<f64>,
    /// The same from the totals.
    pub(super) cow_1m_0pct_ops_ratio_totals: Option<f64>,
    /// 1 MiB: cow create_ref (share + map), µs.
    pub(super) cow_1m_create_ref_us: Option<f64>,
    /// 1 MiB: the copy variant's create_ref (share + map + copy), µs.
    pub(super) copy_1m_create_ref_us: Option<f64>,
    /// 1 MiB: the callee's copy of the buffer alone, µs.
    pub(super) copy_1m_copy_us: Option<f64>,
    /// copy create_ref / cow create_ref at 1 MiB, 0% written.
    pub(super) create_ref_speedup_1m: Option<f64>,
    /// Per payload size, by reference: bytes the forwarder copied per request.
    pub(super) lb_ref_forwarder_bytes_copied_per_call: Vec<SizeRatio>,
    /// Per payload size, by reference: Ref bytes the forwarder sent per request.
    pub(super) lb_ref_forwarder_handle_bytes_per_call: Vec<SizeRatio>,
    /// Per payload size, by value: bytes the forwarder copied per request.
    pub(super) lb_value_forwarder_bytes_copied_per_call: Vec<SizeRatio>,
}

#[derive(Debug, Serialize)]
pub(super) struct SizeRatio {
    pub(super) size_bytes: usize,
    pub(super) value: f64,
}

pub(super) fn find<'a>(
    rows: &'a [Row],
    experiment: &str,
    variant: &str,
    size: usize,
    hops: Option<u32>,
    fraction: Option<f64>,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.experiment == experiment
            && r.variant == variant
            && r.size_bytes == size
            && (hops.is_none() || r.hops == hops)
            && (fraction.is_none() || r.write_fraction == fraction)
    })
}

impl Summary {
    pub(super) fn of(rows: &[Row]) -> Summary {
        let chain = |v: &str, size, hops| find(rows, "nested_chain", v, size, Some(hops), None);
        let tput = |r: Option<&Row>| r.map(|r| r.throughput_per_s);
        // Hop counts are interleaved round by round: the median of the rounds' ratios.
        let hop_ratio = |v: &str| -> Vec<SizeRatio> {
            CHAIN_SIZES
                .iter()
                .filter_map(|&s| {
                    let (far, near) = (chain(v, s, MAX_HOPS)?, chain(v, s, 1)?);
                    let value = median_of_ratios(
                        &far.round_throughputs_per_s,
                        &near.round_throughputs_per_s,
                    )
                    .or_else(|| ratio(tput(Some(far))?, tput(Some(near))?))?;
                    Some(SizeRatio {
                        size_bytes: s,
                        value,
                    })
                })
                .collect()
        };
        let cow = find(rows, "cow", "cow", 1 << 20, None, Some(0.0));
        let copy = find(rows, "cow", "copy", 1 << 20, None, Some(0.0));
        let lb = |v: &str, f: fn(&Row) -> Option<f64>| -> Vec<SizeRatio> {
            LB_SIZES
                .iter()
                .filter_map(|&s| {
                    let value = f(find(rows, "load_balancer", v, s, None, None)?)?;
                    Some(SizeRatio {
                        size_bytes: s,
                        value,
                    })
                })
                .collect()
        };
        Summary {
            chain_7hop_64k_ref_over_value: chain("by_ref", 64 << 10, MAX_HOPS)
                .and_then(|r| r.ratio_median_of_rounds),
            chain_7hop_64k_ref_over_value_totals: chain("by_ref", 64 << 10, MAX_HOPS)
                .and_then(|r| r.ratio_vs_baseline),
            chain_ref_7hop_over_1hop: hop_ratio("by_ref"),
            chain_value_7hop_over_1hop: hop_ratio("by_value"),
            cow_1m_0pct_ops_ratio: cow.and_then(|r| r.ratio_median_of_rounds),
            cow_1m_0pct_ops_ratio_totals: cow.and_then(|r| r.ratio_vs_baseline),
            cow_1m_create_ref_us: cow.and_then(|r| r.create_ref_us),
            copy_1m_create_ref_us: copy.and_then(|r| r.create_ref_us),
            copy_1m_copy_us: copy.and_then(|r| r.copy_us),
            create_ref_speedup_1m: copy
                .and_then(|r| r.create_ref_us)
                .zip(cow.and_then(|r| r.create_ref_us))
                .and_then(|(a, b)| ratio(a, b)),
            lb_ref_forwarder_bytes_copied_per_call: lb("by_ref", |r| {
                r.forwarder_bytes_copied_per_call
            }),
            lb_ref_forwarder_handle_bytes_per_call: lb("by_ref", |r| {
                r.forwarder_handle_bytes_per_call
            }),
            lb_value_forwarder_bytes_copied_per_call: lb("by_value", |r| {
                r.forwarder_bytes_copied_per_call
            }),
        }
    }
}
