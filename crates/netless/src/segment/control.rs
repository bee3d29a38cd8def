//! A server's control segment: its soft registers and live values ([`ServerControl`]) and its
//! workers' counters ([`WorkerStats`]), written by the server alone and mapped read-only by
//! every client (a [`Published`] memfd, sealed against writable mappings), so no client can
//! change what another client, or the server's own workers, read from it.
//!
//! ```text
//! 0      ControlHeader   magic "NLCONTRL", version, workers, stats offset and stride, length
//! 64     ServerControl   registers (wait mode, batching, SLO, depth limit), live connections
//! 128    WorkerStats     one per worker, written only by that worker
//! ```
//!
//! Creating writes the geometry; attaching reads it once and validates it against the
//! mapping's real length, as for the replica segment.

use std::os::fd::{BorrowedFd, OwnedFd};

use netless_shm::fabric::Extent;
use netless_shm::{Published, PublishedView};

use super::place::Place;

use super::layout::{ServerControl, WorkerStats, LAYOUT_VERSION};
use crate::status::Status;

/// Magic at the start of a control segment.
const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"NLCONTRL");
/// Offset of the [`ServerControl`] line.
const SERVER_CONTROL_OFFSET: usize = 64;
/// Offset of the first [`WorkerStats`].
const STATS_OFFSET: usize = 128;
/// Most workers a control segment describes.
const MAX_WORKERS: u32 = 1024;

/// Geometry of a control segment, written by the server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ControlHeader {
    magic: u64,
    version: u32,
    /// Number of [`WorkerStats`].
    workers: u32,
    stats_offset: u64,
    stats_stride: u64,
    total_len: u64,
    reserved: [u64; 3],
}
const _: () = assert!(std::mem::size_of::<ControlHeader>() == 64);

/// The mapping behind a [`ControlSegment`]: the server's writable one, or a client's view
/// (held for its mapping; read through the views only).
enum Backing {
    Server(Published),
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    Client(PublishedView),
}

/// A mapped control segment.
pub(crate) struct ControlSegment {
    server_control: &'static ServerControl,
    stats: &'static [WorkerStats],
    // Declared last: the views above borrow its mapping.
    backing: Backing,
    /// Where it is in a fabric region, if the server made it in one.
    extent: Option<Extent>,
}

impl ControlSegment {
    /// Creates a control segment for `workers` workers (server side).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn create(service: &str, workers: u32) -> Result<ControlSegment, Status> {
        Self::create_in(service, workers, Place::Memfd)
    }

    /// As [`ControlSegment::create`], in `place`.
    pub(crate) fn create_in(
        service: &str,
        workers: u32,
        place: Place<'_>,
    ) -> Result<ControlSegment, Status> {
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(Status::invalid_argument(format!(
                "a server has 1..={MAX_WORKERS} workers"
            )));
        }
        let stride = std::mem::size_of::<WorkerStats>();
        let total_len = STATS_OFFSET + workers as usize * stride;
        let (published, extent) = place
            .published(&format!("netless-control-{service}"), total_len)
            .map_err(|e| {
                Status::resource_exhausted(format!("cannot create the control segment: {e}"))
            })?;
        let header = ControlHeader {
            magic: CONTROL_MAGIC,
            version: LAYOUT_VERSION,
            workers,
            stats_offset: STATS_OFFSET as u64,
            stats_stride: stride as u64,
            total_len: total_len as u64,
            reserved: [0; 3],
        };
        // SAFETY: the mapping is page aligned and at least 128 bytes, and nobody else maps it
        // yet.
        unsafe { std::ptr::write(published.as_ptr() as *mut ControlHeader, header) };
        let base = published.as_ptr();
        // SAFETY: the regions the header describes lie inside the mapping (computed above).
        let mut control = unsafe { Self::assemble(base, header, Backing::Server(published)) };
        control.extent = extent;
        Ok(control)
    }

    /// The longest control segment a client maps.
    pub(crate) fn max_len() -> usize {
        STATS_OFFSET + MAX_WORKERS as usize * std::mem::size_of::<WorkerStats>()
    }

    /// Where it is in a fabric region, if the server made it in one.
    pub(crate) fn extent(&self) -> Option<Extent> {
        self.extent
    }

    /// Maps a server's control segment read-only and validates its geometry (client side).
    pub(crate) fn attach(fd: OwnedFd) -> Result<ControlSegment, Status> {
        let max_len = STATS_OFFSET + MAX_WORKERS as usize * std::mem::size_of::<WorkerStats>();
        let view = PublishedView::attach(fd, max_len).map_err(|e| {
            Status::unavailable(format!("cannot map the server's control segment: {e}"))
        })?;
        Self::attach_view(view)
    }

    /// Validates a server's control segment mapped read-only from a fabric region (client
    /// side).
    pub(crate) fn attach_view(view: PublishedView) -> Result<ControlSegment, Status> {
        if view.len() > Self::max_len() {
            return Err(Status::unavailable(
                "the server's control segment is larger than a client maps",
            ));
        }
        let bad = |what: &str| {
            Err(Status::unavailable(format!(
                "the server's control segment is malformed ({what}); is it a netless server of the same version?"
            )))
        };
        if view.len() < STATS_OFFSET {
            return bad("too short");
        }
        // SAFETY: the mapping is page aligned and at least 128 bytes; the header is plain
        // integers (any bytes are a valid value). This is the one read of it.
        let g: ControlHeader = unsafe { std::ptr::read_volatile(view.as_ptr().cast()) };
        let stride = std::mem::size_of::<WorkerStats>() as u64;
        let fits = u64::from(g.workers)
            .checked_mul(stride)
            .and_then(|n| n.checked_add(STATS_OFFSET as u64))
            .is_some_and(|end| end <= view.len() as u64);
        if g.magic != CONTROL_MAGIC {
            return bad("bad magic");
        }
        if g.version != LAYOUT_VERSION {
            return bad("layout version mismatch");
        }
        if !(1..=MAX_WORKERS).contains(&g.workers)
            || g.stats_offset != STATS_OFFSET as u64
            || g.stats_stride != stride
            || g.total_len != view.len() as u64
            || !fits
        {
            return bad("geometry");
        }
        let base = view.as_ptr() as *mut u8;
        // SAFETY: checked above: the stats lie inside the mapping. The views are only ever
        // loaded from on this side (the mapping is read-only).
        Ok(unsafe { Self::assemble(base, g, Backing::Client(view)) })
    }

    /// # Safety
    /// `header` must describe regions inside the mapping at `base`, which `backing` owns.
    unsafe fn assemble(base: *mut u8, header: ControlHeader, backing: Backing) -> ControlSegment {
        // SAFETY: by the caller's contract both regions lie in the mapping, 64-byte aligned
        // (the offsets are 64 and 128 and the stride a multiple of 64); they hold atomics
        // only. The `'static` borrows are tied to `backing`, dropped after them.
        unsafe {
            ControlSegment {
                server_control: &*(base.add(SERVER_CONTROL_OFFSET) as *const ServerControl),
                stats: std::slice::from_raw_parts(
                    base.add(header.stats_offset as usize) as *const WorkerStats,
                    header.workers as usize,
                ),
                backing,
                extent: None,
            }
        }
    }

    /// The registers and live values. On a client, read-only: a store faults.
    #[inline(always)]
    pub(crate) fn server_control(&self) -> &ServerControl {
        self.server_control
    }

    /// The workers' counters.
    pub(crate) fn stats(&self) -> &[WorkerStats] {
        self.stats
    }

    /// This side's mapping: its first byte and its length (for the fuzz targets' bounds
    /// checks).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn mapping(&self) -> (*const u8, usize) {
        match &self.backing {
            Backing::Server(p) => (p.as_ptr().cast_const(), p.len()),
            Backing::Client(v) => (v.as_ptr(), v.len()),
        }
    }

    /// The memfd to hand a client (server side only).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Server(p) => Some(p.fd()),
            Backing::Client(_) => None,
        }
    }

    /// The memfd a client received (client side only), for tests that try to write it.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn received_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Client(v) => Some(v.fd()),
            Backing::Server(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Ordering;

    #[test]
    fn clients_read_what_the_server_writes_and_cannot_write() {
        let server = ControlSegment::create("control-test", 3).unwrap();
        server
            .server_control()
            .depth_limit
            .store(17, Ordering::Relaxed);
        let fd = server.fd().unwrap().try_clone_to_owned().unwrap();
        let client = ControlSegment::attach(fd).unwrap();
        assert_eq!(client.stats().len(), 3);
        assert_eq!(
            client.server_control().depth_limit.load(Ordering::Relaxed),
            17
        );
        // A plain (writable) segment is refused: a client must never share writable
        // registers with other clients.
        let plain = netless_shm::Segment::create("plain", 4096).unwrap();
        let err = ControlSegment::attach(plain.fd().try_clone_to_owned().unwrap());
        assert!(err.is_err());
    }
}
