//! SLO admission, second half: a worker refuses, without running it, a request that has
//! already waited so long in the queue that it would finish past the SLO.
//!
//! Clients refuse calls up front when the queue is deeper than the model's limit
//! (`ServerControl::depth_limit`, k·(SLO/S − 1) − 1, NEBULA §V). That limit holds the SLO
//! only if every request takes the mean service time S and the workers never stop. On a
//! shared host they do stop: when the hypervisor or a sibling thread takes a worker's CPU for
//! tens of µs, every request queued meanwhile finishes past the SLO, and no depth limit that
//! keeps any queue at all can prevent it. So, under an SLO, a client stamps each queue entry
//! with the time it enqueued it ([`stamp_for`]: `WireHeader::reserved[1]`, µs), and a worker
//! starting an entry checks how long it waited ([`waited_too_long`]). One that waited longer
//! than the SLO less twice the mean service time ([`shed_after_us`]) would finish late: if
//! others wait behind it (refusing it lets them start sooner; a lone request is served,
//! however late, since refusing it helps no one), it is answered at once with a
//! `RESOURCE_EXHAUSTED` NACK ([`crate::Status::is_nack`]: it did not run, so the client may
//! retry it anywhere). A refused request fails as soon as a worker reaches it, without
//! running; how long that takes is how long the stall lasted (never queued without bound).
//!
//! A controller that lowers the admitted depth while served requests finish late refuses
//! calls at moderate load after single stalls, fits per-worker queues badly and still lets
//! stalls through; refusing the very requests a stall made late does none of that.
//!
//! Stamps come from clients, so they are untrusted: a garbage stamp can only get that
//! client's own request refused or served.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::segment::layout::ServerControl;

/// The stamps' clock: the low 32 bits of CLOCK_MONOTONIC in microseconds, never 0 (0 means
/// "no stamp"). Clients stamp entries with it; workers read it when they start an entry.
pub(crate) fn now_us() -> u32 {
    ((netless_shm::monotonic_ns() / 1000) as u32).max(1)
}

/// Whether entries enqueued now carry a stamp (the server admits by depth: an SLO).
pub(crate) fn stamps(ctrl: &ServerControl) -> bool {
    ctrl.depth_limit.load(Ordering::Relaxed) != 0
}

/// The stamp for an entry a client enqueues now: [`now_us`] when the server admits by
/// depth (an SLO), else 0 (no clock read).
pub(crate) fn stamp_for(ctrl: &ServerControl) -> u32 {
    if stamps(ctrl) {
        now_us()
    } else {
        0
    }
}

/// How long an entry may have waited when a worker starts it, µs: the SLO less twice the
/// mean service time (when known; twice, because the request's own service varies around
/// the mean, and a worker sharing its CPU may be held up during it), at least 1 µs; 0 (no
/// SLO): any.
pub(crate) fn shed_after_us(slo_us: u32, service: Option<Duration>) -> u32 {
    let service_us = service.map_or(0, |s| s.as_micros().min(u128::from(u32::MAX)) as u32);
    slo_us
        .saturating_sub(service_us.saturating_mul(2))
        .max(u32::from(slo_us != 0))
}

/// How long an entry stamped `stamp_us` has waited at `now_us`, if that is longer than
/// `shed_after_us` ([`shed_after_us`]; 0: never): it would finish past the SLO.
pub(crate) fn waited_too_long(stamp_us: u32, now_us: u32, shed_after_us: u32) -> Option<u32> {
    // Wrapping difference: the stamp is the low 32 bits of the same clock. A stamp "from the
    // future" (a garbage one) comes out huge: that request is refused.
    let waited = now_us.wrapping_sub(stamp_us);
    (stamp_us != 0 && shed_after_us != 0 && waited > shed_after_us).then_some(waited)
}

/// A worker's bound on how long an entry may have waited ([`shed_after_us`]), kept for the
/// SLO it was computed for and computed again when the SLO changes or [`ShedGate::renew`]
/// says the measured service time moved.
#[derive(Default)]
pub(crate) struct ShedGate {
    /// The SLO (µs) `after_us` was computed for (`None`: compute it again).
    slo_us: Option<u32>,
    /// [`shed_after_us`] for that SLO and the mean service time then.
    after_us: u32,
}

impl ShedGate {
    /// How long an entry stamped `stamp` waited, if too long to finish within the SLO in
    /// `ctrl` (the SLO less twice the mean service time, which `service` gives when the
    /// bound is computed again).
    pub(crate) fn waited_too_long(
        &mut self,
        ctrl: &ServerControl,
        stamp: u32,
        service: impl FnOnce() -> Option<Duration>,
    ) -> Option<u32> {
        let slo_us = (ctrl.slo_ns.load(Ordering::Relaxed) / 1000) as u32;
        if self.slo_us != Some(slo_us) {
            // Declared, measured, or (an SLO set with `netless ctl`) estimated from the stats.
            let service = if slo_us == 0 { None } else { service() };
            self.slo_us = Some(slo_us);
            self.after_us = shed_after_us(slo_us, service);
        }
        waited_too_long(stamp, now_us(), self.after_us)
    }

    /// The measured service time moved: compute the bound again at the next entry.
    pub(crate) fn renew(&mut self) {
        self.slo_us = None;
    }

    /// The SLO the bound was last computed for, µs (0: none).
    pub(crate) fn slo_us(&self) -> u32 {
        self.slo_us.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_leaves_room_for_twice_the_mean_service() {
        assert_eq!(shed_after_us(50, Some(Duration::from_micros(5))), 40);
        assert_eq!(shed_after_us(50, None), 50);
        // A service time as long as the SLO still refuses only what waited at all.
        assert_eq!(shed_after_us(50, Some(Duration::from_millis(1))), 1);
        assert_eq!(shed_after_us(0, Some(Duration::from_micros(5))), 0);
    }

    #[test]
    fn entries_that_waited_past_the_bound_are_refused() {
        assert_eq!(waited_too_long(1_000, 1_040, 40), None);
        assert_eq!(waited_too_long(1_000, 1_041, 40), Some(41));
        // Across the wrap of the µs clock.
        assert_eq!(waited_too_long(u32::MAX - 9, 40, 40), Some(50));
        assert_eq!(waited_too_long(u32::MAX - 9, 20, 40), None);
        // No stamp, or no SLO: never.
        assert_eq!(waited_too_long(0, 1_000_000, 40), None);
        assert_eq!(waited_too_long(1, 1_000_000, 0), None);
        // A stamp from the future (garbage) refuses that request.
        assert!(waited_too_long(2_000, 1_000, 40).is_some());
    }
}
