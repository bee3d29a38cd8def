//! The memory node's gRPC service: [`MemNodeService`] answers the `netless.memnode.MemNode`
//! calls from the node's state, and [`serve`] runs it on a TCP listener with the node's
//! bounds on messages, streams and dead connections.
//!
//! Every call takes the state's lock for one short synchronous step (never across an
//! await): page data is copied and streamed outside it. A sweeper task closes the sessions
//! whose lease ran out. Nothing a client sends or fails to send makes the node panic or
//! wait for it: a stalled Put or Derive is abandoned after a lease without a chunk, and
//! one whose session has ended within a sweep period.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::building::{DerivePages, PutPages, Reservation};
use crate::proto::mem_node_server::{MemNode as MemNodeRpc, MemNodeServer};
use crate::proto::{
    CloseReply, DeriveChunk, HoldReply, HoldRequest, KeepAliveReply, OpenRequest, PutChunk,
    ReadChunk, ReadRequest, Reference, SessionRequest, StatsReply, StatsRequest,
};
use crate::reference::RemoteRef;
use crate::state::State;
use crate::{MemNodeConfig, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, PAGES_PER_CHUNK};

/// What the service's clones share: the state, and whether the sweeper runs.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    sweeper: Once,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // State is consistent between steps (no step panics halfway), so a poisoned lock
        // holds a usable state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The memory node as a tonic service: hand [`MemNodeService::into_server`] to any tonic
/// server (or `netless_grpc::GrpcServer`), or let [`serve`] run it on TCP.
///
/// Cheap to clone; clones are the same node.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use netless_memnode::{MemNodeConfig, MemNodeService};
///
/// let node = MemNodeService::new(MemNodeConfig::default())?;
/// tonic::transport::Server::builder()
///     .add_service(node.into_server())
///     .serve("127.0.0.1:7070".parse().unwrap())
///     .await
///     .map_err(std::io::Error::other)
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemNodeService {
    shared: Arc<Shared>,
}

impl MemNodeService {
    /// An empty node with a fresh incarnation and key.
    ///
    /// # Errors
    /// `InvalidInput` if [`MemNodeConfig::validate`] refuses `config`, naming the field;
    /// if the system's random source fails.
    pub fn new(config: MemNodeConfig) -> std::io::Result<MemNodeService> {
        config.validate()?;
        let state = State::new(config)
            .map_err(|_| std::io::Error::other("the system's random source failed"))?;
        Ok(MemNodeService {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                sweeper: Once::new(),
            }),
        })
    }

    /// The tonic server of this node, with the node's message bounds.
    pub fn into_server(self) -> MemNodeServer<MemNodeService> {
        MemNodeServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// What the node holds now.
    pub fn stats(&self) -> StatsReply {
        self.shared.lock().stats()
    }

    fn lease(&self) -> Duration {
        self.shared.lock().config().lease
    }

    /// How often the sweeper runs, and a Put or Derive waiting for a chunk looks at its
    /// session: a quarter lease, from 10 ms to 1 s.
    fn period(&self) -> Duration {
        (self.lease() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Starts the sweeper on the current runtime, once: the first call starts it, as the
    /// node may be built before any runtime exists.
    fn start_sweeper(&self) {
        self.shared.sweeper.call_once(|| {
            tokio::spawn(sweep(Arc::downgrade(&self.shared), self.period()));
        });
    }

    /// The next chunk of a Put or Derive of `session`, which must still be open: checked
    /// on each chunk and every period while waiting, so a call whose session was closed or
    /// expired ends, and gives its reservation back, within a period. A lease without a
    /// chunk abandons the call.
    async fn next_chunk<M>(
        &self,
        stream: &mut Streaming<M>,
        session: &[u8],
    ) -> Result<Option<M>, Status> {
        let (lease, period) = (self.lease(), self.period());
        // A validated lease is at most a day: the deadline is always there.
        let deadline = tokio::time::Instant::now().checked_add(lease);
        let expired = |now| deadline.is_some_and(|d| now >= d);
        loop {
            let now = tokio::time::Instant::now();
            let wait = deadline.map_or(period, |d| period.min(d.saturating_duration_since(now)));
            let message = tokio::time::timeout(wait, stream.message()).await;
            self.state().session(session, Instant::now())?;
            match message {
                Ok(message) => return message,
                Err(_) if expired(tokio::time::Instant::now()) => {
                    return Err(Status::deadline_exceeded(format!(
                        "no chunk for {} ms (the lease): the call is abandoned; send chunks \
                         without pauses",
                        lease.as_millis()
                    )))
                }
                Err(_) => {}
            }
        }
    }

    /// The lock, after making sure the sweeper runs.
    fn state(&self) -> MutexGuard<'_, State> {
        self.start_sweeper();
        self.shared.lock()
    }
}

/// Closes expired sessions every `period` while the node exists.
async fn sweep(shared: Weak<Shared>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.lock().sweep(Instant::now());
    }
}

fn decode(bytes: &[u8]) -> Result<RemoteRef, Status> {
    RemoteRef::from_bytes(bytes).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn reference(r: RemoteRef) -> Response<Reference> {
    Response::new(Reference {
        reference: Bytes::copy_from_slice(&r.to_bytes()),
    })
}

/// The first message of a client stream; a lease without one abandons the call.
async fn first_chunk<M>(stream: &mut Streaming<M>, lease: Duration) -> Result<Option<M>, Status> {
    match tokio::time::timeout(lease, stream.message()).await {
        Ok(message) => message,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no chunk for {} ms (the lease): the call is abandoned; send chunks without pauses",
            lease.as_millis()
        ))),
    }
}

fn first_only(what: &str) -> Status {
    Status::invalid_argument(format!(
        "only the first chunk of a {what} carries the session and the object's shape"
    ))
}

#[tonic::async_trait]
impl MemNodeRpc for MemNodeService {
    async fn open(
        &self,
        request: Request<OpenRequest>,
    ) -> Result<Response<crate::proto::Session>, Status> {
        // IPv4 clients reaching a dual-stack listener count as their IPv4 address.
        let peer = request.remote_addr().map(|a| a.ip().to_canonical());
        let holder = request.into_inner().holder;
        let mut state = self.state();
        let id = state.open(&holder, peer, Instant::now())?;
        let lease_ms = u64::try_from(state.config().lease.as_millis()).unwrap_or(u64::MAX);
        Ok(Response::new(crate::proto::Session {
            id: Bytes::copy_from_slice(&id),
            lease_ms,
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<SessionRequest>,
    ) -> Result<Response<KeepAliveReply>, Status> {
        let mut state = self.state();
        state.keep_alive(&request.into_inner().session, Instant::now())?;
        Ok(Response::new(KeepAliveReply {
            lease_ms: u64::try_from(state.config().lease.as_millis()).unwrap_or(u64::MAX),
        }))
    }

    async fn close(
        &self,
        request: Request<SessionRequest>,
    ) -> Result<Response<CloseReply>, Status> {
        let released = self
            .state()
            .close(&request.into_inner().session, Instant::now())?;
        Ok(Response::new(CloseReply { released }))
    }

    async fn put(
        &self,
        request: Request<Streaming<PutChunk>>,
    ) -> Result<Response<Reference>, Status> {
        let mut stream = request.into_inner();
        let first = first_chunk(&mut stream, self.lease())
            .await?
            .ok_or_else(|| Status::invalid_argument("a Put without a chunk"))?;
        let (session, total) = (first.session, first.total_len);
        let mut reservation = Reservation::new(self.shared.clone());
        {
            let mut state = self.state();
            state.session(&session, Instant::now())?;
            state.check_len(total)?;
            reservation.grow(&mut state, total.div_ceil(crate::PAGE_SIZE as u64))?;
        }
        let mut pages = PutPages::new(total);
        let mut data = first.data;
        loop {
            if data.len() > MAX_CHUNK_BYTES {
                return Err(Status::invalid_argument(format!(
                    "a Put chunk of {} bytes: send at most {MAX_CHUNK_BYTES} a chunk",
                    data.len()
                )));
            }
            pages.push(&data)?;
            match self.next_chunk(&mut stream, &session).await? {
                Some(chunk) if chunk.session.is_empty() && chunk.total_len == 0 => {
                    data = chunk.data;
                }
                Some(_) => return Err(first_only("Put")),
                None => break,
            }
        }
        let pages = pages.finish()?;
        let r =
            reservation.commit(|state| state.commit_put(&session, total, pages, Instant::now()))?;
        Ok(reference(r))
    }

    type ReadStream = PageStream;

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<PageStream>, Status> {
        let request = request.into_inner();
        let reference = decode(&request.reference)?;
        let end = self
            .state()
            .page_range(&reference, request.first_page, request.pages)?;
        Ok(Response::new(PageStream {
            shared: self.shared.clone(),
            reference,
            next: request.first_page,
            end,
        }))
    }

    async fn derive(
        &self,
        request: Request<Streaming<DeriveChunk>>,
    ) -> Result<Response<Reference>, Status> {
        let mut stream = request.into_inner();
        let first = first_chunk(&mut stream, self.lease())
            .await?
            .ok_or_else(|| Status::invalid_argument("a Derive without a chunk"))?;
        let base = decode(&first.base)?;
        let session = first.session;
        let (shape, len) = {
            let mut state = self.state();
            state.session(&session, Instant::now())?;
            let shape = state.shape(&base)?;
            let len = first.len.unwrap_or(shape.0);
            state.check_len(len)?;
            (shape, len)
        };
        let mut pages = DerivePages::new(self.shared.clone(), base, shape, len);
        let mut writes = first.writes;
        loop {
            if writes.len() > PAGES_PER_CHUNK {
                return Err(Status::invalid_argument(format!(
                    "a Derive chunk of {} writes: send at most {PAGES_PER_CHUNK} a chunk",
                    writes.len()
                )));
            }
            pages.apply(&writes)?;
            match self.next_chunk(&mut stream, &session).await? {
                Some(chunk)
                    if chunk.session.is_empty() && chunk.base.is_empty() && chunk.len.is_none() =>
                {
                    writes = chunk.writes;
                }
                Some(_) => return Err(first_only("Derive")),
                None => break,
            }
        }
        let (written, reservation) = pages.finish()?;
        let r = reservation
            .commit(|state| state.commit_derive(&session, &base, len, written, Instant::now()))?;
        Ok(reference(r))
    }

    async fn retain(&self, request: Request<HoldRequest>) -> Result<Response<HoldReply>, Status> {
        let request = request.into_inner();
        let reference = decode(&request.reference)?;
        self.state()
            .retain(&request.session, &reference, Instant::now())?;
        Ok(Response::new(HoldReply {}))
    }

    async fn release(&self, request: Request<HoldRequest>) -> Result<Response<HoldReply>, Status> {
        let request = request.into_inner();
        let reference = decode(&request.reference)?;
        self.state()
            .release(&request.session, &reference, Instant::now())?;
        Ok(Response::new(HoldReply {}))
    }

    async fn stats(&self, _: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        let mut state = self.state();
        state.sweep(Instant::now());
        Ok(Response::new(state.stats()))
    }
}

/// A Read's pages, looked up a chunk at a time as the client takes them: an object freed
/// halfway ends the stream with NOT_FOUND rather than being kept alive by the read.
#[derive(Debug)]
pub struct PageStream {
    shared: Arc<Shared>,
    reference: RemoteRef,
    next: u64,
    end: u64,
}

impl Stream for PageStream {
    type Item = Result<ReadChunk, Status>;

    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.next >= this.end {
            return Poll::Ready(None);
        }
        let first = this.next;
        let end = (first + PAGES_PER_CHUNK as u64).min(this.end);
        let pages = this.shared.lock().read(&this.reference, first, end);
        this.next = match pages {
            Ok(_) => end,
            Err(_) => this.end,
        };
        Poll::Ready(Some(pages.map(|pages| ReadChunk {
            first_page: first,
            pages,
        })))
    }
}

/// Serves a memory node on `listener` until the process ends (see [`serve_with_shutdown`]).
///
/// # Errors
/// As [`MemNodeService::new`], or if the server stops on an error.
pub async fn serve(listener: TcpListener, config: MemNodeConfig) -> std::io::Result<()> {
    serve_with_shutdown(listener, config, std::future::pending()).await
}

/// Serves a memory node on `listener` until `shutdown` completes.
///
/// HTTP/2 keepalive pings find dead connections within about a lease, so a Put cut off
/// with its host releases its reservation even when no reset arrives.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use netless_memnode::{serve_with_shutdown, MemNodeConfig};
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// println!("LISTENING tcp={}", listener.local_addr()?);
/// serve_with_shutdown(listener, MemNodeConfig::default(), async {
///     tokio::signal::ctrl_c().await.ok();
/// })
/// .await
/// # }
/// ```
///
/// # Errors
/// As [`MemNodeService::new`], or if the server stops on an error.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    config: MemNodeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let ping = (config.lease / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let node = MemNodeService::new(config)?;
    node.start_sweeper();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(ping))
        .http2_keepalive_timeout(Some(ping))
        .max_concurrent_streams(Some(256))
        .concurrency_limit_per_connection(256)
        .add_service(node.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(std::io::Error::other)
}
