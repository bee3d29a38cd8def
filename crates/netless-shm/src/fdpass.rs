//! Length-prefixed frames with attached file descriptors over a Unix stream socket.
//!
//! This module owns the control-socket wire format: a `u32` little-endian payload length,
//! then the payload, with any fds (`SCM_RIGHTS`) attached to the first byte of the frame.
//! It enforces the frame and fd limits and closes excess fds. It never interprets payloads
//! (the handshake messages belong to the RPC layer). `send_frame` and `recv_frame` honour the
//! socket's timeouts as the caller configured them (per system call); `send_frame_by` and
//! `recv_frame_by` bound the whole frame by a deadline, however the peer paces its bytes.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::Error;

/// Largest payload a frame may carry (64 KiB). Bulk data travels through shared memory.
pub const MAX_FRAME: usize = 64 * 1024;

/// Largest number of fds one frame may carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

const PREFIX: usize = 4;

/// Sends one frame: `payload` preceded by its length, with `fds` attached.
///
/// The fds are duplicated into the receiving process; the caller keeps its own. Partial
/// writes and `EINTR` are retried; `SIGPIPE` is never raised.
///
/// # Errors
/// [`Error::FrameTooLarge`] if `payload` exceeds [`MAX_FRAME`]; [`Error::TooManyFds`] if
/// more than [`MAX_FDS`] fds; [`Error::PeerClosed`] if the peer hung up; [`Error::Timeout`]
/// if the socket's write timeout expired (the stream is then unusable if part of the frame
/// was sent); [`Error::Io`] otherwise.
///
/// ```
/// use std::os::fd::AsFd;
/// use std::os::unix::net::UnixStream;
/// use netless_shm::{recv_frame, send_frame, Segment};
///
/// let (a, b) = UnixStream::pair().expect("socketpair");
/// let segment = Segment::create("passed", 4096)?;
/// send_frame(&a, b"hello", &[segment.fd()])?;
/// let (payload, fds) = recv_frame(&b, 1)?;
/// assert_eq!(payload, b"hello");
/// let attached = Segment::attach(fds.into_iter().next().unwrap(), 4096)?;
/// assert_eq!(attached.len(), 4096);
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn send_frame(sock: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
    send(sock, payload, fds, None)
}

/// [`send_frame`] that gives up at `deadline`, however the peer paces its reads: the
/// socket's write timeout is set to the time left before every `sendmsg` (and left so).
///
/// # Errors
/// As [`send_frame`]; [`Error::Timeout`] once `deadline` has passed.
pub fn send_frame_by(
    sock: &UnixStream,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<(), Error> {
    send(sock, payload, fds, Some(deadline))
}

fn send(
    sock: &UnixStream,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Option<Instant>,
) -> Result<(), Error> {
    if payload.len() > MAX_FRAME {
        return Err(Error::FrameTooLarge {
            len: payload.len(),
            max: MAX_FRAME,
        });
    }
    if fds.len() > MAX_FDS {
        return Err(Error::TooManyFds {
            got: fds.len(),
            max: MAX_FDS,
        });
    }
    // `payload.len() <= MAX_FRAME`, so it fits in a u32.
    let prefix = (payload.len() as u32).to_le_bytes();
    let total = PREFIX + payload.len();

    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut first_control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !first_control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Error::Protocol(
            "internal: ancillary buffer too small for the fds".to_owned(),
        ));
    }
    let mut no_control = SendAncillaryBuffer::default();

    let mut sent = 0;
    while sent < total {
        let iov_storage;
        let iov: &[IoSlice<'_>] = if sent < PREFIX {
            iov_storage = [IoSlice::new(&prefix[sent..]), IoSlice::new(payload)];
            &iov_storage
        } else {
            iov_storage = [IoSlice::new(&payload[sent - PREFIX..]), IoSlice::new(&[])];
            &iov_storage[..1]
        };
        // The fds ride on the first sendmsg only: the kernel attaches them to the bytes it sent.
        let control = if sent == 0 {
            &mut first_control
        } else {
            &mut no_control
        };
        if let Some(deadline) = deadline {
            let left = time_left(deadline)?;
            sock.set_write_timeout(Some(left)).map_err(|e| {
                Error::os("setsockopt")(Errno::from_io_error(&e).unwrap_or(Errno::INVAL))
            })?;
        }
        match rustix::net::sendmsg(sock, iov, control, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(Error::PeerClosed),
            Ok(n) => sent += n,
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(map_socket_errno("sendmsg", errno)),
        }
    }
    Ok(())
}

/// Receives exactly one frame and the fds attached to it.
///
/// Blocks until the whole frame arrived, honouring the socket's read timeout. Received fds
/// are close-on-exec. At most `max_fds` fds are accepted: if the peer sends more, all of them
/// are closed and the call fails.
///
/// # Errors
/// [`Error::PeerClosed`] on EOF (before or inside a frame); [`Error::Timeout`] if the read
/// timeout expired before the frame started (or the socket is non-blocking and empty);
/// [`Error::FrameTooLarge`] if the announced length exceeds [`MAX_FRAME`];
/// [`Error::TooManyFds`]; [`Error::Protocol`] if the timeout expired in the middle of a
/// frame (the stream can no longer be resynchronised: close it); [`Error::Io`] otherwise.
///
/// ```no_run
/// use std::os::unix::net::UnixStream;
/// use std::time::Duration;
///
/// let sock = UnixStream::connect("/run/user/1000/netless/echo.sock").expect("connect");
/// sock.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
/// let (payload, fds) = netless_shm::recv_frame(&sock, 4)?;
/// # Ok::<(), netless_shm::Error>(())
/// ```
pub fn recv_frame(sock: &UnixStream, max_fds: usize) -> Result<(Vec<u8>, Vec<OwnedFd>), Error> {
    recv(sock, max_fds, MAX_FRAME, None)
}

/// [`recv_frame`] of a frame of at most `max_len` bytes that gives up at `deadline`, however
/// the peer paces its bytes (one byte every so often cannot hold it longer): the socket's
/// read timeout is set to the time left before every `recvmsg` (and left so).
///
/// # Errors
/// As [`recv_frame`]; [`Error::FrameTooLarge`] if the peer announces more than `max_len`
/// bytes (nothing more is read); [`Error::Timeout`] once `deadline` has passed before the
/// frame started, [`Error::Protocol`] in the middle of one.
///
/// ```
/// use std::os::unix::net::UnixStream;
/// use std::time::{Duration, Instant};
///
/// let (a, b) = UnixStream::pair().expect("socketpair");
/// std::io::Write::write_all(&mut &a, &[9, 0])?; // half a length, then nothing
/// let got = netless_shm::recv_frame_by(&b, 0, 64, Instant::now() + Duration::from_millis(50));
/// assert!(got.is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn recv_frame_by(
    sock: &UnixStream,
    max_fds: usize,
    max_len: usize,
    deadline: Instant,
) -> Result<(Vec<u8>, Vec<OwnedFd>), Error> {
    recv(sock, max_fds, max_len.min(MAX_FRAME), Some(deadline))
}

fn recv(
    sock: &UnixStream,
    max_fds: usize,
    max_len: usize,
    deadline: Option<Instant>,
) -> Result<(Vec<u8>, Vec<OwnedFd>), Error> {
    let max_fds = max_fds.min(MAX_FDS);
    // Space for `max_fds` fds; alignment padding may leave room for one more, which the
    // count check below catches. Anything beyond is dropped by the kernel with MSG_CTRUNC.
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
    let mut fds = Vec::new();
    let mut truncated = false;

    let mut prefix = [0u8; PREFIX];
    let mut reading = Reading {
        sock,
        space: &mut space,
        fds: &mut fds,
        truncated: &mut truncated,
        deadline,
    };
    reading.read_exact(&mut prefix, false)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max_len {
        return Err(Error::FrameTooLarge { len, max: max_len });
    }
    let mut payload = vec![0u8; len];
    reading.read_exact(&mut payload, true)?;

    if truncated || fds.len() > max_fds {
        // Dropping `fds` closes every descriptor we did receive.
        return Err(Error::TooManyFds {
            got: fds.len().max(max_fds + 1),
            max: max_fds,
        });
    }
    Ok((payload, fds))
}

/// One frame being read: the socket, where its fds go, and when to give up.
struct Reading<'a> {
    sock: &'a UnixStream,
    space: &'a mut [MaybeUninit<u8>],
    fds: &'a mut Vec<OwnedFd>,
    truncated: &'a mut bool,
    deadline: Option<Instant>,
}

impl Reading<'_> {
    /// Fills `buf` completely, collecting fds. `in_frame` tells whether bytes of this frame
    /// were already consumed, which turns a timeout into a protocol error.
    fn read_exact(&mut self, buf: &mut [u8], mut in_frame: bool) -> Result<(), Error> {
        let in_frame_error = |err: Error, in_frame: bool| match err {
            Error::Timeout if in_frame => {
                Error::Protocol("timed out in the middle of a frame from the peer".to_owned())
            }
            other => other,
        };
        let mut filled = 0;
        while filled < buf.len() {
            if let Some(deadline) = self.deadline {
                let left = time_left(deadline).map_err(|e| in_frame_error(e, in_frame))?;
                self.sock.set_read_timeout(Some(left)).map_err(|e| {
                    Error::os("setsockopt")(Errno::from_io_error(&e).unwrap_or(Errno::INVAL))
                })?;
            }
            let mut control = RecvAncillaryBuffer::new(self.space);
            let mut iov = [IoSliceMut::new(&mut buf[filled..])];
            let received = match rustix::net::recvmsg(
                self.sock,
                &mut iov,
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(received) => received,
                Err(Errno::INTR) => continue,
                Err(errno) => {
                    return Err(in_frame_error(map_socket_errno("recvmsg", errno), in_frame))
                }
            };
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received_fds) = message {
                    self.fds.extend(received_fds);
                }
            }
            if received.flags.contains(ReturnFlags::CTRUNC) {
                *self.truncated = true;
            }
            if received.bytes == 0 {
                return Err(Error::PeerClosed);
            }
            filled += received.bytes;
            in_frame = true;
        }
        Ok(())
    }
}

/// The time left before `deadline`, at least 1 ms (a zero timeout means none to the
/// kernel); [`Error::Timeout`] once it has passed.
fn time_left(deadline: Instant) -> Result<Duration, Error> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .map(|left| left.max(Duration::from_millis(1)))
        .ok_or(Error::Timeout)
}

fn map_socket_errno(op: &'static str, errno: Errno) -> Error {
    match errno {
        // EAGAIN == EWOULDBLOCK on Linux: SO_RCVTIMEO/SO_SNDTIMEO expired or non-blocking.
        Errno::AGAIN | Errno::TIMEDOUT => Error::Timeout,
        Errno::PIPE | Errno::CONNRESET => Error::PeerClosed,
        errno => Error::os(op)(errno),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::time::Duration;

    #[test]
    fn a_trickling_peer_cannot_hold_a_frame_past_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        // A length announcing 1000 bytes, then one byte every 50 ms for 3 s: each read
        // finishes well within any per-read timeout.
        let trickler = std::thread::spawn(move || {
            let mut a = a;
            let _ = a.write_all(&1000u32.to_le_bytes());
            for _ in 0..60 {
                if a.write_all(&[7]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = std::time::Instant::now();
        let got = recv_frame_by(&b, 0, MAX_FRAME, started + Duration::from_millis(300));
        let took = started.elapsed();
        assert!(matches!(got, Err(Error::Protocol(_))), "{got:?}");
        assert!(took < Duration::from_millis(1500), "held for {took:?}");
        drop(b);
        trickler.join().unwrap();
        // A frame that arrives in time is read whole.
        let (a, b) = UnixStream::pair().unwrap();
        send_frame(&a, b"on time", &[]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        assert_eq!(recv_frame_by(&b, 0, 64, deadline).unwrap().0, b"on time");
        // A frame longer than the caller takes is refused from its length alone.
        send_frame(&a, &[0; 65], &[]).unwrap();
        assert!(matches!(
            recv_frame_by(&b, 0, 64, deadline),
            Err(Error::FrameTooLarge { len: 65, max: 64 })
        ));
        // And a deadline already past times out before reading anything.
        let past = std::time::Instant::now() - Duration::from_millis(1);
        let (a, b) = UnixStream::pair().unwrap();
        assert!(matches!(
            recv_frame_by(&b, 0, 64, past),
            Err(Error::Timeout)
        ));
        assert!(matches!(
            send_frame_by(&a, b"x", &[], past),
            Err(Error::Timeout)
        ));
    }

    #[test]
    fn empty_frame_round_trips() {
        let (a, b) = UnixStream::pair().unwrap();
        send_frame(&a, &[], &[]).unwrap();
        let (payload, fds) = recv_frame(&b, 0).unwrap();
        assert!(payload.is_empty());
        assert!(fds.is_empty());
    }

    #[test]
    fn max_frame_round_trips_across_partial_reads() {
        let (a, b) = UnixStream::pair().unwrap();
        let payload: Vec<u8> = (0..MAX_FRAME).map(|i| (i * 7) as u8).collect();
        let sender = {
            let payload = payload.clone();
            std::thread::spawn(move || {
                send_frame(&a, &payload, &[]).unwrap();
                send_frame(&a, b"next", &[]).unwrap();
            })
        };
        let (got, _) = recv_frame(&b, 0).unwrap();
        assert_eq!(got, payload);
        let (got, _) = recv_frame(&b, 0).unwrap();
        assert_eq!(got, b"next");
        sender.join().unwrap();
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        let (a, b) = UnixStream::pair().unwrap();
        let big = vec![0u8; MAX_FRAME + 1];
        assert!(matches!(
            send_frame(&a, &big, &[]),
            Err(Error::FrameTooLarge { .. })
        ));
        (&a).write_all(&((MAX_FRAME as u32) + 1).to_le_bytes())
            .unwrap();
        assert!(matches!(
            recv_frame(&b, 0),
            Err(Error::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn eof_is_peer_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(recv_frame(&b, 0), Err(Error::PeerClosed)));

        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[10, 0]).unwrap();
        drop(a);
        assert!(matches!(recv_frame(&b, 0), Err(Error::PeerClosed)));
    }

    #[test]
    fn send_to_closed_peer_is_peer_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(matches!(send_frame(&a, b"x", &[]), Err(Error::PeerClosed)));
    }

    #[test]
    fn read_timeout_is_timeout() {
        let (_a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(matches!(recv_frame(&b, 0), Err(Error::Timeout)));
    }

    #[test]
    fn too_many_fds_are_refused_and_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        let fds = [x.as_fd(), y.as_fd(), x.as_fd(), y.as_fd()];
        send_frame(&a, b"four", &fds).unwrap();
        assert!(matches!(
            recv_frame(&b, 1),
            Err(Error::TooManyFds { max: 1, .. })
        ));
        // The stream stays in sync: the next frame is read correctly.
        send_frame(&a, b"none", &[]).unwrap();
        let (payload, fds) = recv_frame(&b, 1).unwrap();
        assert_eq!(payload, b"none");
        assert!(fds.is_empty());
    }

    #[test]
    fn received_fds_are_cloexec() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        send_frame(&a, b"fd", &[x.as_fd()]).unwrap();
        let (_, fds) = recv_frame(&b, 1).unwrap();
        assert_eq!(fds.len(), 1);
        let flags = rustix::io::fcntl_getfd(&fds[0]).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
