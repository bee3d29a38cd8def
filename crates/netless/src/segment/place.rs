//! Where a new segment lives: a sealed memfd of its own (one kernel, handed over by fd), or
//! units of a fabric region (found by offset).

use netless_shm::fabric::{Extent, Fabric};
use netless_shm::{Published, Segment};

/// A fabric directory entry's extents, by index: the replica segment, the control segment
/// and the connect slots.
pub(crate) const REPLICA_EXTENT: usize = 0;
pub(crate) const CONTROL_EXTENT: usize = 1;
pub(crate) const MAILBOX_EXTENT: usize = 2;

/// Where [`crate::segment`] makes a segment.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place<'a> {
    /// A memfd of its own.
    Memfd,
    /// Units of this fabric's heap, held by this process's membership.
    Fabric(&'a Fabric),
}

impl Place<'_> {
    /// A zero-filled read-write segment of `len` bytes, and its extent in a fabric.
    pub(crate) fn segment(
        self,
        name: &str,
        len: usize,
    ) -> Result<(Segment, Option<Extent>), netless_shm::Error> {
        match self {
            Place::Memfd => Ok((Segment::create(name, len)?, None)),
            Place::Fabric(fabric) => {
                let extent = fabric.alloc(len)?;
                match fabric.map(extent) {
                    Ok(segment) => {
                        zero(segment.as_ptr(), segment.len());
                        Ok((segment, Some(extent)))
                    }
                    Err(e) => {
                        fabric.free(extent);
                        Err(e)
                    }
                }
            }
        }
    }

    /// A zero-filled segment only its creator writes, and its extent in a fabric.
    pub(crate) fn published(
        self,
        name: &str,
        len: usize,
    ) -> Result<(Published, Option<Extent>), netless_shm::Error> {
        match self {
            Place::Memfd => Ok((Published::create(name, len)?, None)),
            Place::Fabric(fabric) => {
                let extent = fabric.alloc(len)?;
                match fabric.map_published(extent) {
                    Ok(published) => {
                        zero(published.as_ptr(), published.len());
                        Ok((published, Some(extent)))
                    }
                    Err(e) => {
                        fabric.free(extent);
                        Err(e)
                    }
                }
            }
        }
    }
}

/// Units of a fabric keep whatever their last holder wrote: a new segment starts as zeroes,
/// as a new memfd does.
fn zero(base: *mut u8, len: usize) {
    // SAFETY: `base` is a fresh mapping of `len` bytes of units this process just took;
    // nobody else has been told where they are.
    unsafe { std::ptr::write_bytes(base, 0, len) };
}
