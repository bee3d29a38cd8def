//! Queueing arithmetic for SLO-sized receive buffers (NEBULA §IV-C, §V-C): Erlang-C, the
//! mean queue length of an M/M/k server, and the buffer and queue-depth limits they imply.
//!
//! A request that waits behind a deep queue misses its SLO anyway, so a server needs room
//! only for the requests that can still meet it: 10 × E\[Nq\] messages of the mean size.
//!
//! ```
//! // NEBULA's worked example: 64 cores at load 63, 1 KiB messages → E[Nq] ≈ 54, ~540 KB.
//! let s = netless::sizing::size_buffer(64, 63.0, 1024);
//! assert!((s.mean_queue - 54.0).abs() < 1.0);
//! assert_eq!(s.buffer_bytes, s.slots as usize * 64);
//! ```

/// Slot size of the shared receive buffer the sizing counts in.
pub const SLOT_BYTES: usize = 64;

/// Queued messages provisioned per unit of E\[Nq\] (NEBULA: covers the 99th percentile of
/// even a bimodal service-time distribution).
pub const HEADROOM: f64 = 10.0;

/// Probability that an arrival has to wait in an M/M/k queue with offered load `a` Erlangs
/// (the Erlang-C formula, `C_k(A)`); 1 when the queue is unstable (`a >= k`).
pub fn erlang_c(k: u32, a: f64) -> f64 {
    let k_f = f64::from(k);
    if k == 0 || a >= k_f {
        return 1.0;
    }
    if a <= 0.0 {
        return 0.0;
    }
    // Erlang-B by its recurrence (stable for any k), then C from B.
    let mut b = 1.0;
    for n in 1..=k {
        b = a * b / (f64::from(n) + a * b);
    }
    k_f * b / (k_f - a * (1.0 - b))
}

/// Mean number of queued (waiting, not in service) requests, E\[Nq\] = C_k(A) · A / (k − A);
/// infinite when the queue is unstable.
pub fn mean_queue_len(k: u32, a: f64) -> f64 {
    let k_f = f64::from(k);
    if a >= k_f {
        return f64::INFINITY;
    }
    erlang_c(k, a) * a / (k_f - a)
}

/// Probability that an M/M/k arrival waits longer than `t` mean service times:
/// `C_k(A) · e^{-(k-A)·t}`.
pub fn wait_exceeds(k: u32, a: f64, t: f64) -> f64 {
    let k_f = f64::from(k);
    if a >= k_f {
        return 1.0;
    }
    erlang_c(k, a) * (-(k_f - a) * t).exp()
}

/// The highest offered load (Erlangs) at which an M/M/k server keeps the 99th percentile of
/// queueing within `slo_over_service − 1` mean service times (the SLO minus one service).
pub fn max_load_for_slo(k: u32, slo_over_service: f64) -> f64 {
    let t = (slo_over_service - 1.0).max(0.0);
    let (mut lo, mut hi) = (0.0, f64::from(k));
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if wait_exceeds(k, mid, t) <= 0.01 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Most requests that may be queued ahead of a new one for it still to meet an SLO of
/// `slo_over_service` mean service times on `k` workers draining one queue: with `q` ahead it
/// starts after about `(q + 1) / k` service times, so `q ≤ k · (SLO/S − 1) − 1`.
pub fn depth_limit(k: u32, slo_over_service: f64) -> u32 {
    let q = f64::from(k) * (slo_over_service - 1.0) - 1.0;
    if q < 1.0 {
        1
    } else {
        q.floor().min(f64::from(u32::MAX)) as u32
    }
}

/// A receive buffer sized from the queueing model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizing {
    /// Workers (`k`).
    pub workers: u32,
    /// Offered load in Erlangs (`A`).
    pub load: f64,
    /// Erlang-C probability of waiting.
    pub wait_probability: f64,
    /// E\[Nq\], mean requests waiting.
    pub mean_queue: f64,
    /// 64-byte slots: ⌈10 × E\[Nq\] × mean message bytes / 64⌉.
    pub slots: u32,
    /// `slots × 64`.
    pub buffer_bytes: usize,
}

/// Sizes a receive buffer for `k` workers at offered load `a` with messages of
/// `mean_msg_bytes` on average: 10 × E\[Nq\] × B, rounded up to whole slots (at least one
/// message). `a` must be below `k` (a stable queue); it is clamped just under it otherwise.
pub fn size_buffer(k: u32, a: f64, mean_msg_bytes: usize) -> Sizing {
    let k = k.max(1);
    let a = a.clamp(0.0, f64::from(k) * (1.0 - 1e-9));
    let mean_queue = mean_queue_len(k, a);
    let bytes = (HEADROOM * mean_queue * mean_msg_bytes as f64)
        .max(mean_msg_bytes as f64)
        .min(f64::from(u32::MAX) * SLOT_BYTES as f64);
    let slots = (bytes / SLOT_BYTES as f64).ceil().max(1.0) as u32;
    Sizing {
        workers: k,
        load: a,
        wait_probability: erlang_c(k, a),
        mean_queue,
        slots,
        buffer_bytes: slots as usize * SLOT_BYTES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_known_values() {
        // M/M/1: C = ρ.
        assert!((erlang_c(1, 0.7) - 0.7).abs() < 1e-12);
        // M/M/2 at A = 1: C = 1/3.
        assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(erlang_c(4, 4.0), 1.0);
        assert_eq!(erlang_c(4, 0.0), 0.0);
    }

    #[test]
    fn mean_queue_mm1() {
        // M/M/1: E\[Nq\] = ρ² / (1 − ρ).
        let rho: f64 = 0.9;
        assert!((mean_queue_len(1, rho) - rho * rho / (1.0 - rho)).abs() < 1e-9);
        assert!(mean_queue_len(3, 3.0).is_infinite());
    }

    #[test]
    fn nebula_worked_example() {
        // §IV-C: "for a 64-core CPU at an extreme load of A = 63, E\[Nq\] = 54"; §V-C: 540 KB.
        let s = size_buffer(64, 63.0, 1024);
        assert!((s.mean_queue - 54.0).abs() / 54.0 < 0.02, "{s:?}");
        let kb = s.buffer_bytes as f64 / 1024.0;
        assert!((kb - 540.0).abs() / 540.0 < 0.02, "{kb}");
    }

    #[test]
    fn slo_load_and_depth() {
        let a = max_load_for_slo(1, 10.0);
        assert!(a > 0.5 && a < 1.0, "{a}");
        assert!(wait_exceeds(1, a, 9.0) <= 0.0100001);
        // Pooling: 16 workers on one queue run at a higher utilisation under the same SLO.
        assert!(max_load_for_slo(16, 10.0) / 16.0 > a);
        assert_eq!(depth_limit(1, 10.0), 8);
        assert_eq!(depth_limit(4, 10.0), 35);
        assert_eq!(depth_limit(1, 1.5), 1);
    }
}
