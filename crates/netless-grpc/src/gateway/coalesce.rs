//! Write coalescing for the gateway's HTTP/2 connections.
//!
//! h2 flushes its write buffer before it queues anything after a DATA frame it chains (any
//! payload of 256 bytes or more), so a unary reply (HEADERS, DATA, trailers) leaves in two
//! writes, and the client is woken twice. [`Coalesced`] runs the connection with a socket
//! whose writes land in a buffer, and writes the buffer once, when a poll of the connection
//! ends: every frame the connection produced in that poll (for every stream whose reply came
//! in since the last one) goes out in one system call. Reads pass straight through.
//!
//! A poll of the connection never ends with bytes held back: the buffer is written at the
//! end of every poll, and what the socket does not take is written when it is writable again
//! (the socket's readiness wakes the task). Past [`HIGH_WATER`] unwritten bytes, writes are
//! refused (`Pending`) until the socket has taken them, so a slow reader back-pressures h2.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Unwritten bytes above which writes wait for the socket.
const HIGH_WATER: usize = 1 << 20;

struct State<T> {
    io: T,
    /// Bytes accepted from h2 and not yet written to `io`, from `written` on.
    buf: Vec<u8>,
    written: usize,
    /// The first write error: every later write fails with it.
    failed: Option<io::ErrorKind>,
    /// A writer refused at [`HIGH_WATER`], to wake once the buffer drained.
    blocked: Option<Waker>,
}

impl<T: AsyncWrite + Unpin> State<T> {
    /// Writes what the buffer holds, until done or the socket would block (it then wakes
    /// `cx` when writable). Ready once the buffer is empty and `io` flushed.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while self.written < self.buf.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]) {
                Poll::Ready(Ok(0)) => return self.fail(io::ErrorKind::WriteZero),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return self.fail(e.kind()),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.buf.clear();
        self.written = 0;
        if let Some(waker) = self.blocked.take() {
            waker.wake();
        }
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Err(e)) => self.fail(e.kind()),
            other => other,
        }
    }

    fn fail(&mut self, kind: io::ErrorKind) -> Poll<io::Result<()>> {
        self.failed = Some(kind);
        if let Some(waker) = self.blocked.take() {
            waker.wake();
        }
        Poll::Ready(Err(kind.into()))
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }
}

/// The socket half handed to hyper: reads go to `io`, writes to the buffer.
pub(crate) struct CoalescedIo<T> {
    state: Arc<Mutex<State<T>>>,
}

/// Runs `connection` (which writes through the [`CoalescedIo`] made with it) and writes what
/// it buffered at the end of each poll.
pub(crate) struct Coalesced<F, T> {
    connection: Pin<Box<F>>,
    state: Arc<Mutex<State<T>>>,
}

/// Wraps `io`: serve the connection on the returned [`CoalescedIo`] and poll it inside
/// [`Coalesced::new`] with the same `io` handle.
pub(crate) fn coalesce<T>(io: T) -> (CoalescedIo<T>, CoalescedHandle<T>) {
    let state = Arc::new(Mutex::new(State {
        io,
        buf: Vec::new(),
        written: 0,
        failed: None,
        blocked: None,
    }));
    (
        CoalescedIo {
            state: state.clone(),
        },
        CoalescedHandle { state },
    )
}

/// The driver's handle on a [`CoalescedIo`]'s buffer.
pub(crate) struct CoalescedHandle<T> {
    state: Arc<Mutex<State<T>>>,
}

impl<F, T> Coalesced<F, T> {
    pub(crate) fn new(connection: F, handle: CoalescedHandle<T>) -> Coalesced<F, T> {
        Coalesced {
            connection: Box::pin(connection),
            state: handle.state,
        }
    }

    /// The connection being run (to ask it to shut down).
    pub(crate) fn inner(&mut self) -> Pin<&mut F> {
        self.connection.as_mut()
    }
}

fn lock<T>(state: &Mutex<State<T>>) -> MutexGuard<'_, State<T>> {
    // Only the one task that owns the connection ever locks it: never contended, and a
    // panic inside cannot leave the buffer half-updated in a way that matters.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl<F: Future, T: AsyncWrite + Unpin> Future for Coalesced<F, T> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let output = self.connection.as_mut().poll(cx);
        // A write error is the connection's to report: its next write or flush fails.
        let _ = lock(&self.state).drain(cx);
        output
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CoalescedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.state).io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> CoalescedIo<T> {
    fn accept(&self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let mut state = lock(&self.state);
        if let Some(kind) = state.failed {
            return Poll::Ready(Err(kind.into()));
        }
        if state.pending() >= HIGH_WATER {
            // Try the socket first; wait for the driver's drain if it takes too little.
            let _ = state.drain(cx);
            if state.pending() >= HIGH_WATER {
                state.blocked = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        let mut accepted = 0;
        for b in bufs {
            state.buf.extend_from_slice(b);
            accepted += b.len();
        }
        Poll::Ready(Ok(accepted))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.accept(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.accept(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Buffered bytes count as flushed: the driver writes them when this poll ends.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match lock(&self.state).failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = lock(&self.state);
        std::task::ready!(state.drain(cx))?;
        Pin::new(&mut state.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes made during one poll reach the peer in one piece, at the end of that poll.
    #[tokio::test]
    async fn writes_of_one_poll_leave_together() {
        let (near, mut far) = tokio::io::duplex(1 << 16);
        let (mut io, handle) = coalesce(near);
        let writer = async move {
            io.write_all(b"headers").await.unwrap();
            io.flush().await.unwrap();
            io.write_all(b"+data").await.unwrap();
            io.flush().await.unwrap();
            // Nothing has left yet: all of it was written in this poll.
            std::future::pending::<()>().await;
        };
        let connection = Coalesced::new(writer, handle);
        let task = tokio::spawn(connection);
        let mut got = vec![0; 12];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"headers+data");
        task.abort();
    }

    /// A peer that does not read stops the writer at the high-water mark instead of letting
    /// the buffer grow.
    #[tokio::test]
    async fn a_slow_reader_back_pressures_the_writer() {
        let (near, mut far) = tokio::io::duplex(1 << 12);
        let (mut io, handle) = coalesce(near);
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = written.clone();
        let writer = async move {
            let chunk = vec![7u8; 64 << 10];
            loop {
                io.write_all(&chunk).await.unwrap();
                io.flush().await.unwrap();
                counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
            }
        };
        let task = tokio::spawn(Coalesced::new(writer, handle));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let stuck = written.load(std::sync::atomic::Ordering::Relaxed);
        assert!(stuck <= HIGH_WATER + (128 << 10), "buffered {stuck} bytes");
        // Reading lets it go on.
        let mut sink = vec![0; 1 << 20];
        far.read_exact(&mut sink).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(written.load(std::sync::atomic::Ordering::Relaxed) > stuck);
        task.abort();
    }
}
