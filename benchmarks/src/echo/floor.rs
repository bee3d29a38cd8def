//! The floor: the physical limit of this machine for a cross-process round trip. Two
//! processes ping-pong one 64-byte cache line through shared memory with plain spinning —
//! no ring, no framing, no serialization, no syscalls. No RPC transport can beat it.
//!
//! Segment layout (a 4 KiB memfd from [`netless_shm::Segment::create`]):
//!
//! | bytes    | line    | written by | content                                           |
//! |----------|---------|------------|---------------------------------------------------|
//! | 0..64    | ping    | parent     | 8 × `AtomicU64`, all = sequence number            |
//! | 64..128  | pong    | peer       | 8 × `AtomicU64`, all = last ping seen             |
//! | 128..192 | control | peer+parent| `AtomicU32`: 1 while the peer sleeps on the futex |
//!
//! The whole line is written each time so a full 64-byte line moves between cores, as an
//! RPC carrying a 64-byte message would.
//!
//! The peer is this same executable run as `<exe> peer floor --fd N [--pin-cpu C]`, which
//! calls [`peer`]. Between measurement rounds it stops spinning after ~100 ms and
//! sleeps on the control word (a shared futex), so it does not burn a core.
//!
//! Timing uses the benchmarks' [`Stopwatch`] (the TSC) around each round trip; its small
//! overhead is included in every recorded figure, as it is in every other transport's rows.

use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use hdrhistogram::Histogram;
use netless_shm::{futex_wait, futex_wake, Segment};

use crate::harness::clock::Stopwatch;
use crate::harness::peer::{reap, self_exe};

/// Size of the shared segment.
pub(super) const SEGMENT_LEN: usize = 4096;

/// Unrecorded round trips [`Floor::measure`] makes before timing.
pub(super) const WARMUP_ROUND_TRIPS: u64 = 1000;

/// A round trip not answered within this time means the peer died.
pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// Ping value telling the peer to exit.
const EXIT: u64 = u64::MAX;

/// How long the peer spins on an unchanged ping before sleeping on the futex.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(100);

/// Futex sleep slice of the idle peer; it re-checks its parent after each.
const SLEEP_SLICE: Duration = Duration::from_millis(100);

/// A spinner that has waited this long yields its CPU every 1024 spins, so that if both
/// processes share one CPU a round trip costs two `sched_yield`s, not two time slices.
/// Never reached in a measured round trip on separate CPUs (~0.1–0.3 µs).
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// Control word values.
const AWAKE: u32 = 0;
const SLEEPING: u32 = 1;

/// One cache line of sequence numbers.
#[repr(C, align(64))]
struct Line([AtomicU64; 8]);

impl Line {
    /// Writes `seq` to the whole line; the first word last, with Release.
    #[inline(always)]
    fn publish(&self, seq: u64) {
        for w in &self.0[1..] {
            w.store(seq, Ordering::Relaxed);
        }
        self.0[0].store(seq, Ordering::Release);
    }

    #[inline(always)]
    fn load(&self) -> u64 {
        self.0[0].load(Ordering::Acquire)
    }
}

#[repr(C)]
struct Shared {
    ping: Line,
    pong: Line,
    control: ControlLine,
}

#[repr(C, align(64))]
struct ControlLine {
    sleeping: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Shared>() == 192);
const _: () = assert!(std::mem::size_of::<Shared>() <= SEGMENT_LEN);

/// # Safety
/// `seg` is at least `size_of::<Shared>()` bytes, page aligned, and only ever accessed
/// through atomics (by both processes).
unsafe fn shared(seg: &Segment) -> &Shared {
    debug_assert!(seg.len() >= std::mem::size_of::<Shared>());
    // SAFETY: per the contract above; `Shared` is all atomics, valid for any bit pattern
    // (the memfd starts zeroed), and lives as long as the borrow of `seg`.
    unsafe { &*seg.as_ptr().cast::<Shared>() }
}

/// Wakes the peer if it is sleeping (or about to) on the control word.
fn wake_peer(sh: &Shared) {
    if sh.control.sleeping.swap(AWAKE, Ordering::SeqCst) == SLEEPING {
        futex_wake(&sh.control.sleeping, 1);
    }
}

/// The `floor` peer role.
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// The inherited memfd of the shared segment.
    #[arg(long)]
    pub fd: i32,
    /// Pin the peer to this CPU.
    #[arg(long)]
    pub pin_cpu: Option<usize>,
}

/// The peer side: `peer floor --fd N [--pin-cpu C]`.
///
/// Maps the segment whose memfd is inherited as `fd`, pins the thread to `pin_cpu` if given,
/// then answers every new ping sequence number `s` by publishing `s` on the pong line.
/// After ~100 ms without a new ping it sleeps on the control futex until the parent wakes
/// it. Returns when the ping is `u64::MAX` or the parent process is gone.
pub(super) fn peer(args: PeerArgs) -> anyhow::Result<()> {
    let PeerArgs { fd, pin_cpu } = args;
    if fd < 0 {
        bail!("--fd {fd} is not a file descriptor");
    }
    let parent = rustix::process::getppid();
    // SAFETY: the parent passed us this inherited descriptor for our exclusive use; nothing
    // else in this process owns it. If it is not open, fstat in `attach` fails cleanly.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let seg = Segment::attach(owned, SEGMENT_LEN)
        .with_context(|| format!("mapping the floor segment from --fd {fd}"))?;
    if seg.len() < std::mem::size_of::<Shared>() {
        bail!("the floor segment is only {} bytes", seg.len());
    }
    if let Some(cpu) = pin_cpu {
        netless_shm::pin_current_thread(cpu)
            .with_context(|| format!("pinning the floor peer to cpu {cpu}"))?;
    }
    // SAFETY: checked the length; the segment is only accessed through atomics.
    let sh = unsafe { shared(&seg) };
    let parent_alive = || rustix::process::getppid() == parent;

    // Start from the last ping answered (0), not the current ping: the parent may already
    // have sent its first ping while we were starting.
    let mut last = sh.pong.load();
    loop {
        // Spin phase.
        let mut since = Instant::now();
        let mut spins: u32 = 0;
        loop {
            let s = sh.ping.load();
            if s != last {
                if s == EXIT {
                    return Ok(());
                }
                sh.pong.publish(s);
                last = s;
                spins = 0;
                since = Instant::now();
                continue;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & 1023 == 0 {
                let idle = since.elapsed();
                if idle >= SPIN_BEFORE_SLEEP {
                    break;
                }
                if idle >= YIELD_AFTER {
                    // Let the parent run if it shares our CPU.
                    std::thread::yield_now();
                }
            }
        }

        // Sleep phase: publish SLEEPING, re-check the ping (Dekker with `wake_peer`), sleep.
        loop {
            sh.control.sleeping.store(SLEEPING, Ordering::SeqCst);
            if sh.ping.0[0].load(Ordering::SeqCst) != last {
                break;
            }
            futex_wait(&sh.control.sleeping, SLEEPING, Some(SLEEP_SLICE));
            if sh.control.sleeping.load(Ordering::SeqCst) == AWAKE {
                break;
            }
            if !parent_alive() {
                return Ok(());
            }
        }
        sh.control.sleeping.store(AWAKE, Ordering::SeqCst);
        if !parent_alive() {
            return Ok(());
        }
    }
}

/// A running floor peer process and the shared cache lines.
///
/// Dropping it tells the peer to exit (ping = `u64::MAX`), wakes it, waits up to 2 s, then
/// kills it.
pub(super) struct Floor {
    child: Child,
    seg: Segment,
    seq: u64,
}

impl std::fmt::Debug for Floor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Floor")
            .field("peer_pid", &self.child.id())
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Floor {
    /// Creates the segment and spawns `<this executable> peer floor --fd N [--pin-cpu C]`,
    /// passing it a duplicate of the memfd without `FD_CLOEXEC`.
    ///
    /// The peer inherits the calling thread's CPU affinity: with `pin_peer_cpu = None`, call
    /// this *before* pinning the measuring thread, or the peer ends up confined to the same
    /// CPU (it still works, via `sched_yield`, but measures the scheduler, not the floor).
    ///
    /// The duplicate exists only while spawning; another thread of this process spawning a
    /// child at the same moment could inherit it too (harmless: it would just hold the 4 KiB
    /// segment open).
    pub(super) fn start(pin_peer_cpu: Option<usize>) -> anyhow::Result<Floor> {
        Floor::start_exe(&self_exe()?, &["peer"], pin_peer_cpu)
    }

    /// [`Floor::start`] with `exe PREFIX… floor …` as the peer.
    fn start_exe(
        exe: &Path,
        prefix: &[&str],
        pin_peer_cpu: Option<usize>,
    ) -> anyhow::Result<Floor> {
        let seg =
            Segment::create("netless-floor", SEGMENT_LEN).context("creating the floor segment")?;
        let inherit = rustix::io::dup(seg.fd()).context("dup of the floor memfd")?;
        rustix::io::fcntl_setfd(&inherit, rustix::io::FdFlags::empty())
            .context("clearing FD_CLOEXEC on the floor memfd")?;

        let mut cmd = Command::new(exe);
        cmd.args(prefix)
            .args(["floor", "--fd"])
            .arg(inherit.as_fd().as_raw_fd().to_string());
        if let Some(cpu) = pin_peer_cpu {
            cmd.arg("--pin-cpu").arg(cpu.to_string());
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {} peer floor", exe.display()))?;
        drop(inherit);

        Ok(Floor { child, seg, seq: 0 })
    }

    /// Wakes the peer, makes [`WARMUP_ROUND_TRIPS`] unrecorded round trips, then `calls`
    /// timed ones, recording each in nanoseconds in `hist`.
    ///
    /// A round trip: publish `seq + 1` on the ping line (Release), spin until the pong line
    /// reads `seq + 1` (Acquire). Fails if the peer does not answer within
    /// [`PEER_TIMEOUT`] (it died or never started).
    pub(super) fn measure(
        &mut self,
        calls: u64,
        hist: &mut Histogram<u64>,
        watch: &Stopwatch,
    ) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait().context("checking the floor peer")? {
            bail!("the floor peer exited ({status})");
        }
        // SAFETY: the segment is SEGMENT_LEN bytes and only accessed through atomics.
        let sh = unsafe { shared(&self.seg) };
        wake_peer(sh);
        for i in 0..WARMUP_ROUND_TRIPS + calls {
            let next = self.seq + 1;
            let start = Instant::now();
            let mark = watch.mark();
            sh.ping.publish(next);
            let mut spins: u32 = 0;
            while sh.pong.load() != next {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins & 1023 == 0 {
                    let waited = start.elapsed();
                    if waited >= PEER_TIMEOUT {
                        let status = match self.child.try_wait() {
                            Ok(Some(s)) => format!("it exited ({s})"),
                            _ => "it is still running".to_string(),
                        };
                        bail!(
                            "the floor peer did not answer ping {next} within {} ms; {status}",
                            PEER_TIMEOUT.as_millis()
                        );
                    }
                    // Went to sleep before our first ping was seen (race with wake_peer).
                    if waited >= Duration::from_millis(1) {
                        wake_peer(sh);
                    }
                    if waited >= YIELD_AFTER {
                        // Let the peer run if it shares our CPU.
                        std::thread::yield_now();
                    }
                }
            }
            let ns = watch.elapsed_ns(mark);
            self.seq = next;
            if i >= WARMUP_ROUND_TRIPS {
                hist.saturating_record(ns.max(1));
            }
        }
        Ok(())
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        // SAFETY: as in `measure`.
        let sh = unsafe { shared(&self.seg) };
        sh.ping.publish(EXIT);
        wake_peer(sh);
        reap(&mut self.child, Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_three_cache_lines() {
        assert_eq!(std::mem::offset_of!(Shared, ping), 0);
        assert_eq!(std::mem::offset_of!(Shared, pong), 64);
        assert_eq!(std::mem::offset_of!(Shared, control), 128);
    }

    #[test]
    fn measure_fails_instead_of_hanging_when_the_peer_is_dead() {
        // /bin/true ignores its arguments and exits at once: nobody answers the pings.
        let mut floor = Floor::start_exe(Path::new("/bin/true"), &[], None).unwrap();
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        let watch = Stopwatch::calibrate();
        let err = floor.measure(10, &mut crate::harness::histogram::new_histogram(), &watch);
        assert!(err.is_err());
        assert!(start.elapsed() < Duration::from_secs(3));
    }
}
