//! An async call: the future `Client::call_async` returns. It never blocks its executor:
//! while the connection's spin budget lasts, one async call per connection (the spinner)
//! polls the response ring itself from its task, and after that the reaper thread collects
//! replies and wakes the tasks.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::call::Reply;
use super::slots::{deadline_status, lock, DONE};
use super::Client;
use crate::status::Status;
use crate::sync::Ordering;

/// How often the reaper checks whether a spinning async call still holds the role.
pub(super) const SPINNER_CHECK: Duration = Duration::from_millis(1);

pub(super) enum AsyncState {
    Ring { index: usize },
    Thread(Arc<Oneshot>),
    Failed(Option<Status>),
    Finished,
}

/// The result of a call run on a helper thread, and the waker of the task awaiting it.
type OneshotState = (Option<Result<Reply, Status>>, Option<Waker>);

#[derive(Default)]
pub(super) struct Oneshot {
    value: Mutex<OneshotState>,
}

impl Oneshot {
    pub(super) fn complete(&self, value: Result<Reply, Status>) {
        let waker = {
            let mut v = lock(&self.value);
            v.0 = Some(value);
            v.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// How long an async call that is its connection's spinner polls the response ring within
/// one `poll` of its future before returning `Pending` (and asking to be polled again).
const IN_POLL_SPIN: Duration = Duration::from_micros(4);

pub(super) struct CallFuture {
    pub(super) client: Client,
    pub(super) state: AsyncState,
    pub(super) deadline: Option<Instant>,
    /// Whether this call may still take the spinner's role.
    pub(super) may_spin: bool,
    /// Set while this call is the connection's spinner: until then, a pending poll asks to be
    /// polled again at once instead of waiting for the reaper's wake-up (the async form of
    /// the wait policy's spin phase). The task yields to every other ready task in between,
    /// so it never blocks the executor, and each poll drains the ring for every call, waking
    /// the others on the same executor without a thread hand-off. At most one call spins per
    /// connection; the reaper keeps off the ring meanwhile.
    pub(super) spin_until: Option<Instant>,
    /// `delivered` when the spin budget was last renewed.
    pub(super) progress: u64,
}

impl Future for CallFuture {
    type Output = Result<Reply, Status>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let shared = this.client.handle.conn.clone();
        match &mut this.state {
            AsyncState::Finished => {
                Poll::Ready(Err(Status::internal("future polled after completion")))
            }
            AsyncState::Failed(status) => {
                let status = status
                    .take()
                    .unwrap_or_else(|| Status::internal("no status"));
                this.state = AsyncState::Finished;
                Poll::Ready(Err(status))
            }
            AsyncState::Thread(cell) => {
                let mut v = lock(&cell.value);
                match v.0.take() {
                    Some(result) => {
                        drop(v);
                        this.state = AsyncState::Finished;
                        Poll::Ready(result)
                    }
                    None => {
                        v.1 = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
            AsyncState::Ring { index, .. } => {
                let index = *index;
                let slot = shared.slots.get(index);
                let finish = |this: &mut CallFuture, result| {
                    shared.async_waiters.fetch_sub(1, Ordering::AcqRel);
                    this.stop_spinning(false);
                    this.state = AsyncState::Finished;
                    Poll::Ready(result)
                };
                if slot.state() == DONE {
                    return finish(this, shared.slots.take_reply(index));
                }
                // The spinner's role first, so that the drain below, seeing a spinner, leaves
                // the reaper asleep instead of waking it (a system call, and a thread on this
                // core) for a call this task polls itself.
                if this.spin_until.is_none() {
                    // Adopt a vacant role (held for us, the reaper is off the ring), or take a
                    // free one.
                    let adopted = shared
                        .role_vacant
                        .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok();
                    let claimed = !adopted
                        && this.may_spin
                        && shared
                            .spinning
                            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok();
                    if adopted || claimed {
                        this.spin_until = Instant::now().checked_add(shared.config.wait.spin);
                        this.progress = shared.slots.delivered.load(Ordering::Relaxed);
                    }
                    if claimed {
                        // Get the reaper out of its wait (where it holds the ring).
                        netless_ring::notify(shared.doorbell());
                    }
                }
                // The spinner polls the ring in place for a moment before handing the task
                // back to the executor: a round trip through the executor costs more than
                // the cache-line transfer that brings the reply (from `block_on`, a wake is
                // an eventfd write and the executor's next turn an `epoll_wait`). It stops as
                // soon as any reply is delivered (other calls' tasks may now be ready) and
                // after IN_POLL_SPIN at most, so the executor is never held longer.
                let spin_from = this.spin_until.map(|_| Instant::now());
                let mut polls = 0u32;
                loop {
                    let before = shared.slots.delivered.load(Ordering::Relaxed);
                    if let Some(mut consumer) = shared.consumer.try_lock() {
                        let max = shared.config.max_message;
                        let drained = shared.slots.drain(&mut consumer, None, max);
                        drop(consumer);
                        shared.after_consumer_release();
                        if let Err(what) = drained {
                            shared.fail(shared.corrupt(&what));
                            break;
                        }
                    }
                    let Some(since) = spin_from else { break };
                    polls += 1;
                    if shared.slots.delivered.load(Ordering::Relaxed) != before
                        || shared.dead.load(Ordering::Relaxed)
                        || (polls.is_multiple_of(32) && since.elapsed() >= IN_POLL_SPIN)
                    {
                        break;
                    }
                    std::hint::spin_loop();
                }
                {
                    let mut waker = lock(&slot.waker);
                    if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *waker = Some(cx.waker().clone());
                    }
                }
                if slot.state() == DONE {
                    return finish(this, shared.slots.take_reply(index));
                }
                let expired = this.deadline.is_some_and(|d| Instant::now() >= d);
                if shared.is_dead() || expired {
                    let mut out = Vec::new();
                    let result = match shared.slots.abandon(index, &mut out) {
                        Some(r) => r.map(|metadata| Reply {
                            metadata,
                            payload: out,
                        }),
                        None if expired => Err(deadline_status()),
                        None => Err(shared.death_status()),
                    };
                    return finish(this, result);
                }
                if this.spin_until.is_some() {
                    // Replies are flowing (calls ahead of this one in the server's queue):
                    // spinning still pays, so the budget runs from the latest reply.
                    let delivered = shared.slots.delivered.load(Ordering::Relaxed);
                    if delivered != this.progress {
                        this.progress = delivered;
                        this.spin_until = Instant::now().checked_add(shared.config.wait.spin);
                    }
                }
                if this.spin_until.is_some_and(|t| Instant::now() < t) {
                    cx.waker().wake_by_ref();
                } else if this.spin_until.is_some() {
                    // Spun out: the reaper takes over, and this call waits to be woken.
                    this.may_spin = false;
                    this.stop_spinning(true);
                }
                Poll::Pending
            }
        }
    }
}

impl CallFuture {
    /// Gives up the spinner's role. `hand_to_reaper` when calls may be left waiting with
    /// nobody polling (the spin ran out, or the call was dropped); after a reply, the next
    /// call on this executor usually takes the role at once, and the reaper checks back
    /// within [`SPINNER_CHECK`] anyway, so it is not woken (a wake-up per call would cost a
    /// context switch per call).
    fn stop_spinning(&mut self, hand_to_reaper: bool) {
        if self.spin_until.take().is_some() {
            let shared = &self.client.handle.conn;
            if !hand_to_reaper && shared.async_waiters.load(Ordering::Acquire) > 0 {
                // Pass the role on without letting go of it (the reaper would otherwise
                // take the ring in the gap): a waiting call's task adopts it when polled.
                shared.role_vacant.store(true, Ordering::Release);
                shared.slots.nudge_one_async();
                return;
            }
            shared.spinning.store(0, Ordering::Release);
            if hand_to_reaper {
                shared.unpark_reaper();
            }
        }
    }
}

impl Drop for CallFuture {
    fn drop(&mut self) {
        self.stop_spinning(true);
        if let AsyncState::Ring { index, .. } = self.state {
            let shared = &self.client.handle.conn;
            *lock(&shared.slots.get(index).waker) = None;
            let mut out = Vec::new();
            let _ = shared.slots.abandon(index, &mut out);
            shared.async_waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
