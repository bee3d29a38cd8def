//! SLO admission by measured sojourn: the queue depth clients may join, lowered from the
//! model's limit while the requests a worker serves wait longer than the SLO, raised back
//! while none do.
//!
//! The model's limit (`ServerControl::depth_limit`, k·(SLO/S − 1) − 1, NEBULA §V) holds the
//! SLO only if every request takes the mean service time S. Real service times vary (cache
//! misses, a cold connection, the host taking the CPU for a moment), and a request admitted
//! behind the limit's worth of others then finishes past the SLO. So, under an SLO, a client
//! stamps each queue entry with the time it enqueued it (`WireHeader::reserved[1]`, µs), and
//! each worker, after serving the entry, counts whether that sojourn exceeded the SLO. It
//! judges windows of [`WINDOW_US`]: one of at least [`EVIDENCE`] requests with more than 1%
//! of them late, and more than the admitted depth of them (one stall of the worker makes at
//! most that many late, whatever the depth; only a longer tail says the depth is too deep),
//! lowers the admitted depth (`ServerControl::depth_admit`) by one; [`RAISE_AFTER`]
//! windows in a row with none late raise it by one, never above the model's limit. A window
//! of fewer requests never lowers it: at low load a late request is the host's doing (the
//! queue was short), and a shorter queue would only refuse calls for nothing. Under overload
//! the depth settles where the tail of the sojourns meets the SLO.
//!
//! Stamps come from clients, so they are untrusted: a garbage stamp can only make one window
//! look late or punctual (the depth stays within 1..=limit); clients that share a buffer are
//! one trust group already (see docs/design.md).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::layout::ServerControl;

/// Length of a judged window, µs.
pub(crate) const WINDOW_US: u32 = 1000;
/// Fewest requests in a window that may lower the depth.
pub(crate) const EVIDENCE: u32 = 128;
/// Windows in a row with no late request before the depth is raised by one.
pub(crate) const RAISE_AFTER: u32 = 2;

/// The stamps' clock: the low 32 bits of CLOCK_MONOTONIC in microseconds, never 0 (0 means
/// "no stamp"). Clients stamp entries with it; workers read it when an entry is done.
pub(crate) fn now_us() -> u32 {
    ((netless_shm::monotonic_ns() / 1000) as u32).max(1)
}

/// The stamp for an entry a client enqueues now: [`now_us`] when the server admits by
/// depth (an SLO), else 0 (no clock read).
pub(crate) fn stamp_for(ctrl: &ServerControl) -> u32 {
    if ctrl.depth_limit.load(Ordering::Relaxed) != 0 {
        now_us()
    } else {
        0
    }
}

/// The depth a client may join: the workers' adapted depth when set and below the model's
/// limit, else that limit (0: no limit).
pub(crate) fn admitted_depth(ctrl: &ServerControl) -> u32 {
    let limit = ctrl.depth_limit.load(Ordering::Relaxed);
    let admit = ctrl.depth_admit.load(Ordering::Relaxed);
    if admit != 0 && admit < limit {
        admit
    } else {
        limit
    }
}

/// What a judged window asks of the admitted depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// More than 1% of a window of at least [`EVIDENCE`] requests, and more than the
    /// admitted depth, finished past the SLO.
    Lower,
    /// None did, in [`RAISE_AFTER`] windows in a row.
    Raise,
    /// Anything else.
    Keep,
}

/// One worker's count of late requests over the current window.
#[derive(Debug, Default)]
pub(crate) struct Sojourns {
    /// When the current window began (µs, the stamps' clock); 0: no window yet.
    since: u32,
    seen: u32,
    late: u32,
    /// Windows in a row with no late request.
    clean: u32,
}

impl Sojourns {
    /// Records a served queue entry of `requests` requests, stamped at `stamp_us` and done
    /// at `now_us` ([`now_us`]), against an SLO of `slo_us`. Returns the window's verdict
    /// when this entry completes one; `depth` (the depth clients may join now,
    /// [`admitted_depth`]) is read only then.
    pub(crate) fn observe(
        &mut self,
        stamp_us: u32,
        now_us: u32,
        slo_us: u32,
        requests: u32,
        depth: impl FnOnce() -> u32,
    ) -> Option<Verdict> {
        // Wrapping difference: the stamp is the low 32 bits of the same clock. A stamp
        // "from the future" (clock skew between cores is none; a garbage stamp is possible)
        // comes out huge and counts as late, which only lowers the depth for one window.
        let sojourn = now_us.wrapping_sub(stamp_us);
        // An entry's requests were served one after another: the last one waited longest;
        // all are counted as late or not with it (conservative for a batch).
        let requests = requests.max(1);
        if self.since == 0 {
            self.since = now_us.max(1);
        }
        self.seen = self.seen.saturating_add(requests);
        if sojourn > slo_us {
            self.late = self.late.saturating_add(requests);
        }
        if now_us.wrapping_sub(self.since) < WINDOW_US {
            return None;
        }
        let clean = if self.late == 0 { self.clean + 1 } else { 0 };
        let verdict = if self.seen >= EVIDENCE
            && u64::from(self.late) * 100 > u64::from(self.seen)
            && self.late > depth()
        {
            Verdict::Lower
        } else if clean >= RAISE_AFTER {
            Verdict::Raise
        } else {
            Verdict::Keep
        };
        *self = Sojourns {
            since: now_us.max(1),
            clean: if verdict == Verdict::Raise { 0 } else { clean },
            ..Sojourns::default()
        };
        Some(verdict)
    }
}

/// Applies a verdict to the shared admitted depth, within 1..=`depth_limit`. Several workers
/// may apply theirs at once: each is one CAS, retried a few times at most.
pub(crate) fn apply(ctrl: &ServerControl, verdict: Verdict) {
    let lower = match verdict {
        Verdict::Lower => true,
        Verdict::Raise => false,
        Verdict::Keep => return,
    };
    let limit = ctrl.depth_limit.load(Ordering::Relaxed);
    if limit == 0 {
        return;
    }
    let admit: &AtomicU32 = &ctrl.depth_admit;
    for _ in 0..4 {
        let current = admit.load(Ordering::Relaxed);
        let from = if current == 0 || current > limit {
            limit
        } else {
            current
        };
        let next = if lower {
            from.saturating_sub(1).max(1)
        } else {
            (from + 1).min(limit)
        };
        if next == current
            || admit
                .compare_exchange(current, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(limit: u32) -> ServerControl {
        // SAFETY: ServerControl is plain atomics, for which all-zero bytes are valid.
        let ctrl: ServerControl = unsafe { std::mem::zeroed() };
        ctrl.depth_limit.store(limit, Ordering::Relaxed);
        ctrl
    }

    /// Feeds one window of `n` requests, spread over it, `late` of them late.
    fn window(s: &mut Sojourns, t: &mut u32, n: u32, late: u32) -> Verdict {
        for i in 0..n {
            *t += WINDOW_US / n;
            let sojourn = if i < late { 60 } else { 40 };
            if let Some(v) = s.observe(*t - sojourn, *t, 50, 1, || 2) {
                return v;
            }
        }
        // The window ends with the first entry after it.
        *t += WINDOW_US;
        s.observe(*t - 10, *t, 50, 1, || 2).expect("a window ended")
    }

    #[test]
    fn windows_are_judged_by_their_share_of_late_requests() {
        let (mut s, mut t) = (Sojourns::default(), 1_000_000u32);
        // The first entry opens the first window.
        s.observe(t, t, 50, 1, || 2);
        // 1% late: not more than 1%.
        assert_eq!(window(&mut s, &mut t, 200, 2), Verdict::Keep);
        // 1.5%, and more than the depth (2).
        assert_eq!(window(&mut s, &mut t, 200, 3), Verdict::Lower);
        // As many late as one stall of the worker explains: not the depth's fault.
        assert_eq!(
            s.observe(t, t + WINDOW_US, 50, 1, || 2),
            Some(Verdict::Keep)
        );
        t += WINDOW_US;
        for i in 0..300 {
            let late = if i < 8 { 60 } else { 10 };
            assert_eq!(s.observe(t - late, t, 50, 1, || 8), None);
        }
        t += WINDOW_US;
        // 8 late of 301, with a depth of 8.
        assert_eq!(s.observe(t, t, 50, 1, || 8), Some(Verdict::Keep));
        // Too few requests to blame the queue: late ones never lower the depth.
        assert_eq!(window(&mut s, &mut t, 20, 10), Verdict::Keep);
        for _ in 1..RAISE_AFTER {
            assert_eq!(window(&mut s, &mut t, 200, 0), Verdict::Keep);
        }
        assert_eq!(window(&mut s, &mut t, 200, 0), Verdict::Raise);
        // A late request starts the count of clean windows again.
        assert_eq!(window(&mut s, &mut t, 200, 1), Verdict::Keep);
        for _ in 1..RAISE_AFTER {
            assert_eq!(window(&mut s, &mut t, 20, 0), Verdict::Keep);
        }
        assert_eq!(window(&mut s, &mut t, 20, 0), Verdict::Raise);
    }

    #[test]
    fn a_batch_counts_as_its_requests_and_the_clock_may_wrap() {
        let mut s = Sojourns::default();
        let t = u32::MAX - 10;
        assert_eq!(s.observe(t - 31, t, 50, 100, || 2), None);
        // 31 µs across the wrap: on time; then a late batch of 60 ends the window.
        assert_eq!(s.observe(u32::MAX - 20, 10, 50, 50, || 2), None);
        assert_eq!(s.observe(0, 1_100, 50, 60, || 2), Some(Verdict::Lower)); // 60 of 210 late
    }

    #[test]
    fn the_admitted_depth_moves_within_one_and_the_model_limit() {
        let ctrl = control(8);
        assert_eq!(admitted_depth(&ctrl), 8);
        apply(&ctrl, Verdict::Raise);
        assert_eq!(admitted_depth(&ctrl), 8);
        for expected in (1..8).rev() {
            apply(&ctrl, Verdict::Lower);
            assert_eq!(admitted_depth(&ctrl), expected);
        }
        apply(&ctrl, Verdict::Lower);
        assert_eq!(admitted_depth(&ctrl), 1);
        apply(&ctrl, Verdict::Keep);
        apply(&ctrl, Verdict::Raise);
        assert_eq!(admitted_depth(&ctrl), 2);
        // A lower model limit (netless ctl set depth_limit=…) caps it at once.
        ctrl.depth_admit.store(7, Ordering::Relaxed);
        ctrl.depth_limit.store(3, Ordering::Relaxed);
        assert_eq!(admitted_depth(&ctrl), 3);
        apply(&ctrl, Verdict::Lower);
        assert_eq!(admitted_depth(&ctrl), 2);
        // No limit: nothing to adapt.
        ctrl.depth_limit.store(0, Ordering::Relaxed);
        apply(&ctrl, Verdict::Lower);
        assert_eq!(admitted_depth(&ctrl), 0);
    }
}
